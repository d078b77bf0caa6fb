//! Windows: what `windows-sys` gives beyond the portable fallback (`portable.rs`, whose items
//! this module's callers get for everything not defined here).
//!
//! * CPU time per process and per thread (`GetProcessTimes`, `GetThreadTimes`), so a result's
//!   CPU figures are measured. Windows does not split a thread's context switches into
//!   voluntary and involuntary; it counts only their total (the `\Thread(*)\Context
//!   Switches/sec` performance counter), which sonde does not read yet. So both are `None`
//!   (null, with the `context_switches_unknown` warning), never 0.
//! * UDP send offload (USO, Windows 10 2004 / Server 2022 and later): `UDP_SEND_MSG_SIZE` on
//!   the socket, then one `send` of up to 64 segments that the stack (or the NIC) cuts into
//!   datagrams, as Linux's `UDP_SEGMENT`. Where the option is refused (older Windows, wine) the
//!   error says so and the caller falls back to one datagram per `send`.
//! * The host's interrupts, context switches and system calls (latte's columns), from the
//!   performance counters through PDH: their raw values are counts since boot. A counter PDH
//!   does not have, or that reads 0 (wine implements none of these three), is `None`, and the
//!   result says so in a warning (`system_counters_unknown`).
//! * A host-wide monotonic clock, `QueryPerformanceCounter`, so that two processes on one host
//!   read the same clock (one-way delay on loopback).
//!
//! Kernel timestamps (`SIO_TIMESTAMPING`) are not used yet: `--timestamps` figures are null with
//! a warning, as on every platform without `SO_TIMESTAMPING`.

use std::io;
use std::net::UdpSocket;
use std::os::windows::io::AsRawSocket;
use std::time::Duration;

use windows_sys::Win32::Foundation::FILETIME;
use windows_sys::Win32::Networking::WinSock::{
    WSAGetLastError, IPPROTO_UDP, SOCKET, SOCKET_ERROR, UDP_SEND_MSG_SIZE, WSAEINVAL, WSAENOBUFS,
    WSAENOPROTOOPT, WSAEOPNOTSUPP,
};
use windows_sys::Win32::System::Performance::{
    PdhAddEnglishCounterW, PdhCloseQuery, PdhCollectQueryData, PdhGetRawCounterValue,
    PdhOpenQueryW, QueryPerformanceCounter, QueryPerformanceFrequency, PDH_CSTATUS_NEW_DATA,
    PDH_CSTATUS_VALID_DATA, PDH_RAW_COUNTER,
};
use windows_sys::Win32::System::Threading::{
    GetCurrentProcess, GetCurrentThread, GetProcessTimes, GetThreadTimes,
};

/// The most segments one offloaded send carries (as on Linux).
pub(crate) const MAX_GSO_SEGMENTS: usize = 64;

/// The most bytes one offloaded send carries: a UDP datagram's limit.
pub(crate) const MAX_GSO_BYTES: usize = 65_507;

/// A `FILETIME` (100 ns units) as a duration.
fn filetime(t: FILETIME) -> Duration {
    let ticks = (u64::from(t.dwHighDateTime) << 32) | u64::from(t.dwLowDateTime);
    Duration::from_nanos(ticks.saturating_mul(100))
}

/// User and kernel CPU time of the process, or with `thread` of the calling thread. Context
/// switches are `None`: Windows does not split them into voluntary and involuntary.
pub(crate) fn rusage(thread: bool) -> io::Result<crate::cpu::CpuSnapshot> {
    let zero = FILETIME {
        dwLowDateTime: 0,
        dwHighDateTime: 0,
    };
    let (mut created, mut exited, mut kernel, mut user) = (zero, zero, zero, zero);
    // SAFETY: the pseudo-handles of the current thread and process need no closing and are
    // valid for the call; the four FILETIMEs are writable locals that outlive it.
    let ok = unsafe {
        if thread {
            GetThreadTimes(
                GetCurrentThread(),
                &mut created,
                &mut exited,
                &mut kernel,
                &mut user,
            )
        } else {
            GetProcessTimes(
                GetCurrentProcess(),
                &mut created,
                &mut exited,
                &mut kernel,
                &mut user,
            )
        }
    };
    if ok == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(crate::cpu::CpuSnapshot {
        user: filetime(user),
        system: filetime(kernel),
        voluntary_switches: None,
        involuntary_switches: None,
    })
}

/// Sends `buf` as consecutive `segment`-byte datagrams (the last may be shorter) in one call
/// with UDP send offload. Fails with [`io::ErrorKind::Unsupported`] where Windows refuses
/// `UDP_SEND_MSG_SIZE` (see [`gso_refused`]).
pub(crate) fn send_segments(sock: &UdpSocket, buf: &[u8], segment: u16) -> io::Result<usize> {
    if let Err(e) = setsockopt(sock, IPPROTO_UDP, UDP_SEND_MSG_SIZE, u32::from(segment)) {
        let refused = [WSAENOPROTOOPT, WSAEINVAL, WSAEOPNOTSUPP]
            .iter()
            .any(|&code| e.raw_os_error() == Some(code));
        return Err(if refused {
            io::Error::new(io::ErrorKind::Unsupported, "UDP_SEND_MSG_SIZE refused")
        } else {
            e
        });
    }
    sock.send(buf)
}

/// `setsockopt` with a DWORD value: the one place this crate makes the call on Windows (socket2
/// has no `UDP_SEND_MSG_SIZE`). The error carries Winsock's code.
fn setsockopt(sock: &UdpSocket, level: i32, name: i32, value: u32) -> io::Result<()> {
    let raw = sock.as_raw_socket() as SOCKET;
    // SAFETY: `raw` is the socket `sock` owns, borrowed for the call; the option value is a
    // DWORD local that outlives it, and its length is passed.
    let rc = unsafe {
        windows_sys::Win32::Networking::WinSock::setsockopt(
            raw,
            level,
            name,
            std::ptr::from_ref(&value).cast(),
            i32::try_from(std::mem::size_of::<u32>()).unwrap_or(4),
        )
    };
    if rc == SOCKET_ERROR {
        // SAFETY: reads the calling thread's last Winsock error; no arguments.
        return Err(io::Error::from_raw_os_error(unsafe { WSAGetLastError() }));
    }
    Ok(())
}

/// True for the error [`send_segments`] returns where USO is not offered.
pub(crate) fn gso_refused(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Unsupported
}

/// A UDP socket's report of an ICMP port unreachable for an earlier datagram: Windows fails the
/// next `recv` with `WSAECONNRESET` (Linux with `ECONNREFUSED`), unless `SIO_UDP_CONNRESET` is
/// off. Either way the datagram is gone and the socket still works.
pub(crate) fn port_unreachable(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset
    )
}

/// `WSAENOBUFS`: the stack had no buffer for the datagram; the sender counts it and goes on.
pub(crate) fn no_buffer_space(e: &io::Error) -> bool {
    e.raw_os_error() == Some(WSAENOBUFS)
}

/// The host's monotonic clock (`QueryPerformanceCounter`) in ns: one clock for every process
/// on the host, as `CLOCK_MONOTONIC` on Linux.
pub(crate) fn monotonic_ns() -> u64 {
    let (mut count, mut freq) = (0i64, 0i64);
    // SAFETY: both are writable i64 locals that outlive the calls; neither call fails on
    // Windows XP and later.
    unsafe {
        QueryPerformanceFrequency(&mut freq);
        QueryPerformanceCounter(&mut count);
    }
    let (count, freq) = (
        u128::try_from(count).unwrap_or(0),
        u128::try_from(freq).unwrap_or(0).max(1),
    );
    u64::try_from(count * 1_000_000_000 / freq).unwrap_or(u64::MAX)
}

/// The performance counters behind [`system_activity`], by their English names (the same on
/// every display language): interrupts, context switches and system calls per second, whose
/// raw values (`PERF_COUNTER_COUNTER`) are the counts since boot.
const ACTIVITY_COUNTERS: [&str; 3] = [
    "\\Processor(_Total)\\Interrupts/sec",
    "\\System\\Context Switches/sec",
    "\\System\\System Calls/sec",
];

/// The host's interrupts, context switches and system calls since boot, each `None` where PDH
/// cannot give it: the counter is missing, cannot be read, or reads 0, which a Windows that has
/// run for a moment never counts (wine answers 0 or nothing for these).
pub(crate) fn system_activity() -> crate::cpu::SystemActivity {
    let mut query: isize = 0;
    // SAFETY: a null data source means the live counters; `query` is a writable local.
    if unsafe { PdhOpenQueryW(std::ptr::null(), 0, &mut query) } != 0 {
        return crate::cpu::SystemActivity::default();
    }
    let mut counters = [None; 3];
    for (slot, name) in counters.iter_mut().zip(ACTIVITY_COUNTERS) {
        let wide: Vec<u16> = name.encode_utf16().chain([0]).collect();
        let mut counter: isize = 0;
        // SAFETY: `query` is open; `wide` is NUL-terminated and outlives the call; `counter`
        // is a writable local.
        if unsafe { PdhAddEnglishCounterW(query, wide.as_ptr(), 0, &mut counter) } == 0 {
            *slot = Some(counter);
        }
    }
    let mut values = [None; 3];
    // SAFETY: `query` is open.
    if unsafe { PdhCollectQueryData(query) } == 0 {
        for (value, counter) in values.iter_mut().zip(counters) {
            let Some(counter) = counter else { continue };
            // SAFETY: PDH_RAW_COUNTER is plain data, valid zeroed.
            let mut raw: PDH_RAW_COUNTER = unsafe { std::mem::zeroed() };
            let mut kind = 0u32;
            // SAFETY: `counter` belongs to the open query; `kind` and `raw` are writable locals.
            let status = unsafe { PdhGetRawCounterValue(counter, &mut kind, &mut raw) };
            // Both PDH_CSTATUS_VALID_DATA (0) and PDH_CSTATUS_NEW_DATA (1) mean a valid
            // value; the first read of a counter in a query is typically NEW_DATA, and a
            // check for 0 alone would read every counter as missing.
            if status == 0 && matches!(raw.CStatus, PDH_CSTATUS_VALID_DATA | PDH_CSTATUS_NEW_DATA) {
                *value = u64::try_from(raw.FirstValue).ok().filter(|&n| n > 0);
            }
        }
    }
    // SAFETY: `query` is open and closed once; its counters go with it.
    unsafe { PdhCloseQuery(query) };
    crate::cpu::SystemActivity {
        interrupts: values[0],
        context_switches: values[1],
        syscalls: values[2],
        // Windows's equivalent is DPC time (`\Processor(_Total)\% DPC Time`): not read yet.
        softirq_ns: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Thread and process CPU time grow with work done, and context switches are unknown
    /// (None), not 0.
    #[test]
    fn cpu_time_is_measured_and_switches_are_unknown() {
        let before = rusage(true).unwrap();
        let mut x = 1u64;
        let mut after = before;
        for _ in 0..2_000 {
            for i in 0..100_000u64 {
                x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005) ^ i);
            }
            after = rusage(true).unwrap();
            if after.user > before.user {
                break;
            }
        }
        assert!(after.user > before.user, "{before:?} {after:?}");
        // The process's figures come from another source with its own granularity (under wine,
        // clock ticks): only that they are there, and what they leave unknown.
        let process = rusage(false).unwrap();
        assert_eq!(process.voluntary_switches, None);
        assert_eq!(after.voluntary_switches, None);
        assert_eq!(after.involuntary_switches, None);
    }

    /// A datagram to a closed port comes back as an ICMP port unreachable, which Windows
    /// reports on the next `recv` as `WSAECONNRESET`: the loops must take it as the lost
    /// datagram it is (as `ECONNREFUSED` on Linux), not end the test. Wine reports it as Linux
    /// does, or not at all.
    #[test]
    fn a_port_unreachable_is_recognised_and_the_socket_goes_on() {
        let closed = UdpSocket::bind("127.0.0.1:0").unwrap();
        let gone = closed.local_addr().unwrap();
        drop(closed);
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.connect(gone).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        sock.send(b"anyone?").unwrap();
        let mut buf = [0u8; 16];
        match sock.recv(&mut buf) {
            Err(e) if port_unreachable(&e) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                eprintln!("SKIP-PLATFORM icmp: no port-unreachable report here");
            }
            other => panic!("{other:?}"),
        }
        assert!(port_unreachable(&io::Error::from_raw_os_error(10054)));
        assert!(!port_unreachable(&io::Error::from(io::ErrorKind::TimedOut)));
        // The socket still sends.
        sock.send(b"still here").unwrap();
    }

    /// The clock is one for the host: it does not go backwards.
    #[test]
    fn the_monotonic_clock_moves_forward() {
        let a = monotonic_ns();
        std::thread::sleep(Duration::from_millis(2));
        assert!(monotonic_ns() > a);
    }

    /// One offloaded send arrives as separate datagrams of the segment size; where Windows (or
    /// wine) refuses USO, the refusal is the `Unsupported` the caller falls back on.
    #[test]
    fn an_offloaded_send_arrives_as_separate_datagrams_or_is_refused() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.connect(rx.local_addr().unwrap()).unwrap();
        let buf: Vec<u8> = (0..300u16).map(|i| (i % 251) as u8).collect();
        match send_segments(&tx, &buf, 100) {
            Ok(n) => {
                assert_eq!(n, 300);
                let mut got = [0u8; 400];
                for k in 0..3 {
                    let len = rx.recv(&mut got).unwrap();
                    assert_eq!(&got[..len], &buf[k * 100..(k + 1) * 100]);
                }
            }
            Err(e) => {
                assert!(gso_refused(&e), "{e}");
                eprintln!("SKIP-PLATFORM uso: UDP_SEND_MSG_SIZE refused here ({e}): one datagram per send");
            }
        }
    }

    /// True under wine, which exports `wine_get_version` from its ntdll.dll (Windows' ntdll
    /// has no such function).
    fn under_wine() -> bool {
        use windows_sys::Win32::System::LibraryLoader::{GetModuleHandleA, GetProcAddress};
        // SAFETY: both names are NUL-terminated literals; ntdll.dll is loaded in every
        // process, and its handle needs no release.
        unsafe {
            let ntdll = GetModuleHandleA(c"ntdll.dll".as_ptr().cast());
            !ntdll.is_null() && GetProcAddress(ntdll, c"wine_get_version".as_ptr().cast()).is_some()
        }
    }

    /// On a real Windows the three host-wide counts are there and moving (PDH has had them
    /// since NT); under wine, whose PDH has none of them, each is `None`: never a 0 standing
    /// for "not counted".
    #[test]
    fn system_activity_is_counted_on_windows_and_none_only_under_wine() {
        let before = system_activity();
        for n in [before.interrupts, before.context_switches, before.syscalls] {
            assert_ne!(n, Some(0), "{before:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
        let after = system_activity();
        let moved = after.since(&before);
        if under_wine() {
            eprintln!(
                "SKIP-PLATFORM system-counters: wine's PDH has no host-wide counters ({after:?})"
            );
            return;
        }
        for (name, n) in [
            ("interrupts", after.interrupts),
            ("context switches", after.context_switches),
            ("system calls", after.syscalls),
        ] {
            assert!(n.is_some(), "no PDH count of {name} on Windows: {after:?}");
        }
        assert!(moved.context_switches.is_some_and(|n| n > 0), "{moved:?}");
    }

    /// The test above tells wine from Windows; this machine's answer is one or the other, and
    /// under wine (where CI runs it) it must be wine, or that test would fail on CI.
    #[test]
    fn wine_is_recognised() {
        let wine = under_wine();
        eprintln!("running under wine: {wine}");
        if std::env::var_os("WINEPREFIX").is_some() {
            assert!(wine, "WINEPREFIX is set but wine_get_version was not found");
        }
    }
}
