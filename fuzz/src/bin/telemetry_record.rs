//! `cargo hfuzz run telemetry_record`: see polycorn_fuzz::telemetry_record.
fn main() {
    loop {
        honggfuzz::fuzz!(|data: &[u8]| { polycorn_fuzz::telemetry_record(data) });
    }
}
