#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    sonde_wire::fuzzing::mesh_probe(data);
});
