//! `cargo hfuzz run endpoint_proxy`: see polycorn_fuzz::endpoint_proxy.
fn main() {
    loop {
        honggfuzz::fuzz!(|data: &[u8]| { polycorn_fuzz::endpoint_proxy(data) });
    }
}
