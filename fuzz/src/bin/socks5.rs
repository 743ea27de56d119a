//! `cargo hfuzz run socks5`: see polycorn_fuzz::socks5.
fn main() {
    loop {
        honggfuzz::fuzz!(|data: &[u8]| { polycorn_fuzz::socks5(data) });
    }
}
