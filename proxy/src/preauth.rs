//! Admission of subflows before authentication (the TLS or QUIC handshake
//! and the HELLO): work anyone on the Internet can make the proxy do, kept
//! from crowding out the one train the proxy serves.
//!
//! - At most [`MAX_HANDSHAKES`] at once, each for [`PREAUTH_TIMEOUT`] at
//!   most (handshake and HELLO together).
//! - At most `per_source` of them from one source: an IPv4 address, or an
//!   IPv6 /64 (one host has a whole /64 to pick addresses from). The table
//!   of sources holds only sources with a handshake in flight, so it never
//!   has more than [`MAX_HANDSHAKES`] entries.
//! - [`RESERVED_FOR_KNOWN`] slots are kept for sources that authenticated
//!   before (the last [`MAX_KNOWN`] of them, least recently authenticated
//!   dropped): a train reconnecting from a carrier address it used before
//!   gets in while strangers hold every other slot.
//! - When the strangers' slots are full, a new connection from a stranger
//!   takes the slot of the oldest stranger's handshake if that one has run
//!   for [`EVICT_AFTER`] (a handshake at a normal RTT is done by then): a
//!   flood of silent connections must then be renewed faster than
//!   handshakes finish to keep a new train address out, instead of six
//!   connections a second for the whole proxy.
//!
//! A QUIC connection whose source address is not yet validated may be
//! spoofed: it is counted apart from the same address proven (a TCP
//! handshake or a QUIC retry token proves it) and never counts as a known
//! source, so spoofed packets cannot use a train's reserve or its
//! per-source allowance.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Subflows in their handshake or HELLO at once. A train sets up one per
/// carrier, a few more after a restart.
pub const MAX_HANDSHAKES: usize = 64;
/// Of [`MAX_HANDSHAKES`], the slots only sources that authenticated before
/// may take.
pub const RESERVED_FOR_KNOWN: usize = 16;
/// Sources remembered as having authenticated.
pub const MAX_KNOWN: usize = 64;
/// Handshakes in flight from one source, by default (`--handshakes-per-source`).
pub const DEFAULT_PER_SOURCE: usize = 4;
/// Time for the TLS (or QUIC) handshake and the HELLO together, from the
/// accept. The relay's side takes about one round trip (the client hello
/// arrives with the accept; the proxy's flight, then the client's
/// certificate with the HELLO right behind it), and a carrier's RTT reaches
/// a few seconds during a handover: 6 s leaves room for an RTT of 3 s, or of
/// 2 s with one retransmission, while a silent connection holds its slot
/// for 6 s rather than the 20 s two separate 10 s timeouts allowed.
pub const PREAUTH_TIMEOUT: Duration = Duration::from_secs(6);
/// A stranger's handshake younger than this is never displaced.
pub const EVICT_AFTER: Duration = Duration::from_secs(1);

/// A source: an IPv4 address, or an IPv6 /64 (IPv4-mapped IPv6 is its IPv4
/// address); whether the address is proven (a spoofed QUIC packet's
/// source is not); and whether the per-source limit applies to it (not to
/// a session of the edge's UDP proxy, which stands for no one client).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Source {
    net: IpAddr,
    proven: bool,
    limited: bool,
}

impl Source {
    pub fn new(ip: IpAddr, proven: bool) -> Self {
        let net = match ip {
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
            },
            v4 => v4,
        };
        Source { net, proven, limited: true }
    }

    /// A source the per-source limit does not apply to (the slots in all
    /// still do).
    pub fn unlimited(self) -> Self {
        Source { limited: false, ..self }
    }
}

/// Why a connection was refused before its handshake.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Refusal {
    /// Its source has `per_source` handshakes in flight.
    PerSource,
    /// Every slot it may take is busy with a handshake too young to displace.
    Busy,
}

impl Refusal {
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::PerSource => "per_source",
            Refusal::Busy => "busy",
        }
    }
}

struct Slot {
    source: Source,
    known: bool,
    started: Instant,
    evict: Arc<tokio::sync::Notify>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    /// By id, which is also the order they started in.
    slots: BTreeMap<u64, Slot>,
    per_source: HashMap<Source, usize>,
    /// Slots of sources not known.
    strangers: usize,
    /// Sources that authenticated, least recently first.
    known: VecDeque<Source>,
}

impl State {
    fn remove(&mut self, id: u64) -> Option<Slot> {
        let slot = self.slots.remove(&id)?;
        if let Some(n) = self.per_source.get_mut(&slot.source) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&slot.source);
            }
        }
        if !slot.known {
            self.strangers -= 1;
        }
        Some(slot)
    }
}

/// The slots, and counters of what they refused.
pub struct PreAuth {
    per_source: usize,
    state: Mutex<State>,
    pub refused_per_source: AtomicU64,
    pub refused_busy: AtomicU64,
    /// Strangers' handshakes displaced by a newer connection.
    pub evicted: AtomicU64,
}

impl PreAuth {
    /// `per_source`: handshakes in flight from one source (0: no limit).
    pub fn new(per_source: usize) -> Arc<Self> {
        Arc::new(PreAuth {
            per_source,
            state: Mutex::default(),
            refused_per_source: AtomicU64::new(0),
            refused_busy: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
        })
    }

    /// A slot for a handshake from `source` starting at `now`, or why not
    /// (counted).
    pub fn admit(self: &Arc<Self>, source: Source, now: Instant) -> Result<Permit, Refusal> {
        let r = self.try_admit(source, now);
        match r {
            Err(Refusal::PerSource) => self.refused_per_source.fetch_add(1, Relaxed),
            Err(Refusal::Busy) => self.refused_busy.fetch_add(1, Relaxed),
            Ok(_) => 0,
        };
        r
    }

    fn try_admit(self: &Arc<Self>, source: Source, now: Instant) -> Result<Permit, Refusal> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if self.per_source > 0 && source.limited && st.per_source.get(&source).copied().unwrap_or(0) >= self.per_source
        {
            return Err(Refusal::PerSource);
        }
        let known = source.proven && st.known.contains(&source);
        let full = st.slots.len() >= MAX_HANDSHAKES || (!known && st.strangers >= MAX_HANDSHAKES - RESERVED_FOR_KNOWN);
        if full {
            // The oldest stranger's handshake, if it has had its time; a
            // known source's is never displaced.
            let victim = st
                .slots
                .iter()
                .find(|(_, s)| !s.known)
                .filter(|(_, s)| now.saturating_duration_since(s.started) >= EVICT_AFTER)
                .map(|(id, _)| *id);
            let Some(id) = victim else { return Err(Refusal::Busy) };
            if let Some(slot) = st.remove(id) {
                slot.evict.notify_one();
                self.evicted.fetch_add(1, Relaxed);
            }
        }
        let id = st.next_id;
        st.next_id += 1;
        let evict = Arc::new(tokio::sync::Notify::new());
        st.slots.insert(id, Slot { source, known, started: now, evict: evict.clone() });
        *st.per_source.entry(source).or_default() += 1;
        if !known {
            st.strangers += 1;
        }
        Ok(Permit { owner: self.clone(), id, source, evict })
    }

    /// Handshakes in flight.
    pub fn in_flight(&self) -> usize {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).slots.len()
    }

    fn remember(&self, source: Source) {
        if !source.proven {
            return;
        }
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.known.retain(|s| *s != source);
        st.known.push_back(source);
        while st.known.len() > MAX_KNOWN {
            st.known.pop_front();
        }
    }
}

/// One handshake's slot, given back when dropped.
pub struct Permit {
    owner: Arc<PreAuth>,
    id: u64,
    source: Source,
    evict: Arc<tokio::sync::Notify>,
}

impl Permit {
    /// Resolves when a newer connection took this slot: give up the
    /// handshake.
    pub fn evicted(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let evict = self.evict.clone();
        async move { evict.notified().await }
    }

    /// The peer authenticated: its source is known from now on, and the
    /// slot is free.
    pub fn authenticated(self) {
        self.owner.remember(self.source);
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.owner.state.lock().unwrap_or_else(|e| e.into_inner()).remove(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(s: &str) -> Source {
        Source::new(s.parse().expect("address"), true)
    }

    #[test]
    fn one_source_gets_per_source_slots_and_an_ipv6_source_is_its_slash_64() {
        let p = PreAuth::new(4);
        let t = Instant::now();
        let held: Vec<_> = (0..4).map(|i| p.admit(src(&format!("2001:db8:1:2::{i}")), t).expect("slot")).collect();
        assert_eq!(p.admit(src("2001:db8:1:2:ffff::9"), t).err(), Some(Refusal::PerSource), "same /64");
        assert!(p.admit(src("2001:db8:1:3::1"), t).is_ok(), "another /64");
        assert!(p.admit(src("192.0.2.1"), t).is_ok());
        drop(held);
        assert!(p.admit(src("2001:db8:1:2::1"), t).is_ok(), "slots given back");
        assert_eq!(p.refused_per_source.load(Relaxed), 1);
        assert_eq!(Source::new("::ffff:192.0.2.1".parse().unwrap(), true), src("192.0.2.1"));
        // The edge's UDP sessions stand for no one client: no cap per source.
        let sessions: Vec<_> = (0..6).map(|_| p.admit(src("10.42.0.7").unlimited(), t)).collect();
        assert!(sessions.iter().all(Result::is_ok), "an unlimited source is held to the slots in all only");
    }

    /// Strangers holding every slot they may take, each from its own source.
    fn fill_with_strangers(p: &Arc<PreAuth>, t: Instant) -> Vec<Permit> {
        (0..MAX_HANDSHAKES - RESERVED_FOR_KNOWN)
            .map(|i| p.admit(src(&format!("198.51.100.{i}")), t).expect("a stranger's slot"))
            .collect()
    }

    #[test]
    fn a_known_source_gets_in_while_strangers_hold_their_slots() {
        let p = PreAuth::new(4);
        let t = Instant::now();
        p.admit(src("203.0.113.7"), t).expect("slot").authenticated();
        let _flood = fill_with_strangers(&p, t);
        assert_eq!(p.admit(src("192.0.2.99"), t).err(), Some(Refusal::Busy), "a young flood keeps strangers out");
        let again = p.admit(src("203.0.113.7"), t).expect("the known source uses the reserve");
        assert_eq!(p.in_flight(), MAX_HANDSHAKES - RESERVED_FOR_KNOWN + 1);
        drop(again);
        // Unproven (a QUIC packet's unvalidated source) is not the known source.
        let spoofed = Source::new("203.0.113.7".parse().unwrap(), false);
        assert_eq!(p.admit(spoofed, t).err(), Some(Refusal::Busy));
    }

    #[test]
    fn a_new_stranger_displaces_the_oldest_strangers_handshake_once_it_had_its_time() {
        let p = PreAuth::new(4);
        let t = Instant::now();
        let flood = fill_with_strangers(&p, t);
        let oldest = flood[0].evicted();
        let later = t + EVICT_AFTER;
        let newcomer = p.admit(src("192.0.2.99"), later).expect("displaces the oldest");
        assert_eq!(p.evicted.load(Relaxed), 1);
        assert_eq!(p.in_flight(), MAX_HANDSHAKES - RESERVED_FOR_KNOWN);
        // The displaced handshake is told (the notification is kept).
        tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
            tokio::time::timeout(Duration::from_secs(5), oldest).await.expect("told it was displaced");
        });
        drop(flood); // its drop finds its slot gone
        assert_eq!(p.in_flight(), 1);
        drop(newcomer);
        assert_eq!(p.in_flight(), 0);
    }

    #[test]
    fn the_tables_stay_bounded() {
        let p = PreAuth::new(0);
        let t = Instant::now();
        let mut held = Vec::new();
        for i in 0..10_000u32 {
            let s = Source::new(IpAddr::V4((0x0a00_0000 + i).into()), true);
            if let Ok(permit) = p.admit(s, t) {
                held.push(permit);
            }
        }
        assert_eq!(held.len(), MAX_HANDSHAKES - RESERVED_FOR_KNOWN);
        assert!(p.state.lock().unwrap().per_source.len() <= MAX_HANDSHAKES);
        drop(held);
        for i in 0..1_000u32 {
            p.admit(Source::new(IpAddr::V4((0x0b00_0000 + i).into()), true), t).unwrap().authenticated();
        }
        let st = p.state.lock().unwrap();
        assert_eq!((st.known.len(), st.per_source.len(), st.slots.len()), (MAX_KNOWN, 0, 0));
    }
}
