//! `cargo hfuzz run frame_decoder`: see polycorn_fuzz::frame_decoder.
fn main() {
    loop {
        honggfuzz::fuzz!(|data: &[u8]| { polycorn_fuzz::frame_decoder(data) });
    }
}
