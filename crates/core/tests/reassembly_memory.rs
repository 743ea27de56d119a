//! Reassembly memory under a hostile sender, measured with a counting
//! allocator (this test binary's global allocator; one test, so nothing else
//! allocates beside it).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use polycorn_core::conn::{RecvError, RecvStream, WindowLimits, PIECE_OVERHEAD_SLACK};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// Every byte ever allocated: what reassembly copied, since each copy here
/// lands in a new or grown allocation.
static TOTAL: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    TOTAL.fetch_add(by, Ordering::SeqCst);
    let now = LIVE.fetch_add(by, Ordering::SeqCst) + by;
    PEAK.fetch_max(now, Ordering::SeqCst);
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size >= layout.size() {
            grew(new_size - layout.size());
        } else {
            LIVE.fetch_sub(layout.size() - new_size, Ordering::SeqCst);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static A: Counting = Counting;

const WINDOW: u64 = 1 << 20;

fn stream() -> RecvStream {
    let mut r = RecvStream::new(WindowLimits { initial: WINDOW, max: 8 * WINDOW, min: 64 * 1024 });
    assert_eq!(r.initial_window_update(), Some(WINDOW));
    r
}

/// Peak bytes allocated while `f` runs, above what was live before.
fn peak_of(f: impl FnOnce()) -> usize {
    let base = LIVE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    f();
    PEAK.load(Ordering::SeqCst) - base
}

#[test]
fn hostile_fragments_cost_about_the_window_and_honest_segments_share_allocations() {
    // One-byte pieces at odd offsets across the whole window (without the
    // per-piece charge they would cost about 40x the window): refused once
    // the pieces cost more than the window.
    let mut refused = None;
    let peak = peak_of(|| {
        let mut r = stream();
        for off in (1..WINDOW).step_by(2) {
            if let Err(e) = r.insert(off, b"x", false) {
                refused = Some((off, e, r.out_of_order_pieces()));
                break;
            }
        }
        drop(r);
    });
    let (off, e, pieces) = refused.expect("the fragments were refused");
    eprintln!("fragments: refused at offset {off} with {pieces} pieces, peak {peak} bytes");
    assert!(matches!(e, RecvError::Fragmented { .. }), "{e}");
    assert!(off < WINDOW / 2, "refused at offset {off}");
    let bound = (WINDOW + PIECE_OVERHEAD_SLACK) as usize;
    assert!(peak <= bound + 64 * 1024, "peak {peak} bytes with {pieces} pieces, bound {bound}");

    // Whole 16 KiB segments arriving in reverse order above a gap at 0:
    // they join into one piece, and the window's bytes cost about the window.
    let seg = vec![7u8; 16 * 1024];
    let peak = peak_of(|| {
        let mut r = stream();
        let n = WINDOW / seg.len() as u64;
        for k in (1..n).rev() {
            r.insert(k * seg.len() as u64, &seg, false).unwrap();
        }
        assert_eq!(r.out_of_order_pieces(), 1);
        r.insert(0, &seg, false).unwrap();
        assert_eq!(r.out_of_order_pieces(), 0);
        assert_eq!(r.buffered(), WINDOW);
        drop(r);
    });
    assert!(peak <= 3 * WINDOW as usize, "peak {peak} bytes for a {WINDOW}-byte window");

    // One-byte pieces in reverse order above a gap at 0: each joins the
    // piece after it. Copying that piece for every byte would allocate
    // n^2/2 bytes (8.6 GB for these 128 KiB); joining in place allocates a
    // few times the bytes.
    let n: u64 = 128 * 1024;
    let base = TOTAL.load(Ordering::SeqCst);
    let mut r = stream();
    for off in (1..n).rev() {
        r.insert(off, b"y", false).unwrap();
    }
    assert_eq!(r.out_of_order_pieces(), 1);
    r.insert(0, b"y", false).unwrap();
    assert_eq!(r.buffered(), n);
    let allocated = TOTAL.load(Ordering::SeqCst) - base;
    eprintln!("reverse one-byte pieces: {allocated} bytes allocated for {n} bytes");
    assert!(allocated <= 8 * n as usize, "{allocated} bytes allocated to reassemble {n} bytes");
    drop(r);

    // One-byte pieces at odd offsets, then the gaps filled from the top
    // down: each filler joins a one-byte piece before it to the grown piece
    // after it, which must move the small side, not the large one (moving
    // the large one allocates about 4 KB per piece; the map's nodes and the
    // pieces' own allocations about 170 bytes).
    let pieces: u64 = 8 * 1024;
    let base = TOTAL.load(Ordering::SeqCst);
    let mut r = stream();
    for k in 0..pieces {
        r.insert(2 * k + 1, b"z", false).unwrap();
    }
    for k in (1..pieces).rev() {
        r.insert(2 * k, b"z", false).unwrap();
    }
    assert_eq!(r.out_of_order_pieces(), 1);
    let allocated = TOTAL.load(Ordering::SeqCst) - base;
    eprintln!("gaps filled from the top: {allocated} bytes allocated for {} bytes", 2 * pieces);
    assert!(allocated <= 256 * pieces as usize, "{allocated} bytes allocated for {pieces} pieces");
    drop(r);

    // Every other segment missing (a slow path's share): 32 pieces, fine.
    let mut r = stream();
    for k in (1..WINDOW / seg.len() as u64).step_by(2) {
        r.insert(k * seg.len() as u64, &seg, false).unwrap();
    }
    assert_eq!(r.out_of_order_pieces(), 32);
}
