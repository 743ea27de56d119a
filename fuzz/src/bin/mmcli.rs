//! `cargo hfuzz run mmcli`: see polycorn_fuzz::mmcli.
fn main() {
    loop {
        honggfuzz::fuzz!(|data: &[u8]| { polycorn_fuzz::mmcli(data) });
    }
}
