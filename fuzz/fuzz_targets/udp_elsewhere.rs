#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    sonde_wire::fuzzing::udp_elsewhere(data);
});
