//! `cargo hfuzz run dns`: see polycorn_fuzz::dns.
fn main() {
    loop {
        honggfuzz::fuzz!(|data: &[u8]| { polycorn_fuzz::dns(data) });
    }
}
