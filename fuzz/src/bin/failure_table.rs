//! `cargo hfuzz run failure_table`: see polycorn_fuzz::failure_table.
fn main() {
    loop {
        honggfuzz::fuzz!(|data: &[u8]| { polycorn_fuzz::failure_table(data) });
    }
}
