//! The metrics endpoint: a small HTTP/1.x server that answers `GET /metrics` and `GET /healthz`
//! and nothing else. Requests are read with a size cap and a deadline, one thread per
//! connection up to a few at once; a connection is closed after one answer.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::Context;

/// Largest request head read; more is answered 431 and closed.
const MAX_REQUEST: usize = 8 * 1024;
/// Longest a client may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once; more are closed unanswered.
const MAX_CONNECTIONS: usize = 8;

/// The content type of `prometheus-client`'s text encoder.
const OPENMETRICS_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Prometheus' own text format, for clients that do not ask for OpenMetrics.
const PROMETHEUS_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether the request's `Accept` header asks for OpenMetrics (Prometheus' scrapes do).
pub(crate) fn wants_openmetrics(head: &[u8]) -> bool {
    String::from_utf8_lossy(head).lines().skip(1).any(|l| {
        l.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("accept")
                && value.contains("application/openmetrics-text")
        })
    })
}

/// What a request gets, by method and path.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Route {
    Metrics,
    Health,
    NotFound,
    MethodNotAllowed,
    BadRequest,
}

/// Routes a request head (the request line and headers, up to the blank line).
pub(crate) fn route(head: &[u8]) -> Route {
    let Some(line) = head.split(|&b| b == b'\n').next() else {
        return Route::BadRequest;
    };
    let line = String::from_utf8_lossy(line);
    let mut parts = line.trim_end().split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Route::BadRequest;
    };
    if !version.starts_with("HTTP/1.") {
        return Route::BadRequest;
    }
    // Prometheus may add a query string (none is used).
    let path = target.split('?').next().unwrap_or_default();
    let known = matches!(path, "/metrics" | "/healthz");
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => Route::Metrics,
        ("GET" | "HEAD", "/healthz") => Route::Health,
        _ if known => Route::MethodNotAllowed,
        _ => Route::NotFound,
    }
}

/// Serves on `addr` until `stop`; `body` renders the exposition for each scrape. Returns the
/// address listened on and the accepting thread (it ends within 50 ms of `stop`).
pub(crate) fn serve<F>(
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    body: F,
) -> anyhow::Result<(SocketAddr, thread::JoinHandle<()>)>
where
    F: Fn() -> String + Send + Sync + 'static,
{
    let listener =
        TcpListener::bind(addr).with_context(|| format!("cannot listen for metrics on {addr}"))?;
    let local = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let body = Arc::new(body);
    let busy = Arc::new(AtomicUsize::new(0));
    let accepting = thread::Builder::new()
        .name("sonde-metrics".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok((stream, _)) = listener.accept() else {
                    thread::sleep(Duration::from_millis(50));
                    continue;
                };
                if busy.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
                    continue; // dropped: closed unanswered
                }
                busy.fetch_add(1, Ordering::Relaxed);
                let (body, done) = (Arc::clone(&body), Arc::clone(&busy));
                let spawned = thread::Builder::new()
                    .name("sonde-scrape".into())
                    .spawn(move || {
                        let _ = answer(stream, &*body);
                        done.fetch_sub(1, Ordering::Relaxed);
                    });
                if spawned.is_err() {
                    busy.fetch_sub(1, Ordering::Relaxed);
                }
            }
        })
        .context("cannot start the metrics thread")?;
    Ok((local, accepting))
}

fn answer(mut stream: TcpStream, body: &dyn Fn() -> String) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    loop {
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
            break;
        }
        if head.len() > MAX_REQUEST {
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                "too large\n",
                false,
            );
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        stream.set_read_timeout(Some(left))?;
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let head_only = head.starts_with(b"HEAD ");
    match route(&head) {
        Route::Metrics if wants_openmetrics(&head) => {
            respond(&mut stream, "200 OK", OPENMETRICS_TYPE, &body(), head_only)
        }
        Route::Metrics => {
            let text = super::metrics::to_prometheus_text(&body());
            respond(&mut stream, "200 OK", PROMETHEUS_TYPE, &text, head_only)
        }
        Route::Health => respond(&mut stream, "200 OK", "text/plain", "ok\n", head_only),
        Route::NotFound => respond(
            &mut stream,
            "404 Not Found",
            "text/plain",
            "not found: only /metrics and /healthz\n",
            false,
        ),
        Route::MethodNotAllowed => respond(
            &mut stream,
            "405 Method Not Allowed",
            "text/plain",
            "only GET\n",
            false,
        ),
        Route::BadRequest => respond(
            &mut stream,
            "400 Bad Request",
            "text/plain",
            "bad request\n",
            false,
        ),
    }
}

fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &str,
    head_only: bool,
) -> std::io::Result<()> {
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if status.starts_with("405") {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    if !head_only {
        out.push_str(body);
    }
    stream.write_all(out.as_bytes())?;
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(
            route(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Route::Metrics
        );
        assert_eq!(route(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n"), Route::Metrics);
        assert_eq!(route(b"GET /healthz HTTP/1.1\r\n\r\n"), Route::Health);
        assert_eq!(
            route(b"POST /metrics HTTP/1.1\r\n\r\n"),
            Route::MethodNotAllowed
        );
        assert_eq!(route(b"GET / HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(route(b"GET /metrics/x HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(route(b"GET /metrics\r\n\r\n"), Route::BadRequest);
        assert_eq!(route(b"\xff\xfe"), Route::BadRequest);
    }

    fn get(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(request).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_metrics_and_health_only() {
        let stop = Arc::new(AtomicBool::new(false));
        let (addr, accepting) = serve("127.0.0.1:0".parse().unwrap(), Arc::clone(&stop), || {
            "x 1\n# EOF\n".to_owned()
        })
        .unwrap();
        let m = get(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(
            m.starts_with("HTTP/1.1 200 OK\r\n") && m.ends_with("\r\n\r\nx 1\n"),
            "{m}"
        );
        assert!(m.contains("text/plain; version=0.0.4"), "{m}");
        let om = get(
            addr,
            b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\n\r\n",
        );
        assert!(
            om.ends_with("\r\n\r\nx 1\n# EOF\n") && om.contains("openmetrics-text"),
            "{om}"
        );
        assert!(get(addr, b"GET /healthz HTTP/1.1\r\n\r\n").ends_with("\r\n\r\nok\n"));
        assert!(get(addr, b"GET /debug HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get(addr, b"DELETE /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        let huge = [b'a'; MAX_REQUEST * 2];
        let mut s = TcpStream::connect(addr).unwrap();
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nX: ");
        let _ = s.write_all(&huge);
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        assert!(out.starts_with("HTTP/1.1 431"), "{out}");
        stop.store(true, Ordering::Relaxed);
        accepting.join().unwrap();
    }
}
