//! `cargo hfuzz run gpsd`: see polycorn_fuzz::gpsd.
fn main() {
    loop {
        honggfuzz::fuzz!(|data: &[u8]| { polycorn_fuzz::gpsd(data) });
    }
}
