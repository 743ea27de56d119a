//! `cargo hfuzz run endpoint_relay`: see polycorn_fuzz::endpoint_relay.
fn main() {
    loop {
        honggfuzz::fuzz!(|data: &[u8]| { polycorn_fuzz::endpoint_relay(data) });
    }
}
