//! A path's queue of control frames, bounded against a peer that makes this
//! side answer faster than it reads the answers.
//!
//! Answers that carry no state beyond the latest one are coalesced: one
//! `PONG` per path (the newest `PING`'s), one `TELEMETRY_ACK` per record
//! however often its copies arrive. What remains (`OPEN`, `WINDOW`, `RESET`,
//! `PATH_STATUS`, `TELEMETRY`, `PING`) is generated at most once per
//! connection, record or event, so its length is bounded by what the peer
//! can make this side do; the shell stops reading a path whose queue holds
//! [`CTRL_PAUSE`] frames until its writer has drained it below that, and a
//! queue that reaches [`CTRL_MAX`] (a peer that does not read the path at
//! all while frames for it keep coming from the others) gets the path
//! declared dead, which empties it.

use std::collections::{BTreeSet, VecDeque};

use crate::wire::Frame;

/// Frames queued on one path at which its shell stops reading that path.
pub const CTRL_PAUSE: usize = 8192;

/// Frames queued on one path at which the path is declared dead: its peer
/// has read nothing of a queue this long (a few MB).
pub const CTRL_MAX: usize = 65_536;

#[derive(Debug, Default)]
pub(crate) struct CtrlQueue {
    /// Frames in order; `TELEMETRY_ACK`s and the `PONG` go before them.
    frames: VecDeque<Frame>,
    /// Records to acknowledge, each once.
    telemetry_acks: BTreeSet<u64>,
    /// The newest `PING` to answer: (id, timestamp).
    pong: Option<(u64, u64)>,
}

impl CtrlQueue {
    pub(crate) fn len(&self) -> usize {
        self.frames.len() + self.telemetry_acks.len() + usize::from(self.pong.is_some())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn clear(&mut self) {
        self.frames.clear();
        self.telemetry_acks.clear();
        self.pong = None;
    }

    pub(crate) fn push_back(&mut self, f: Frame) {
        match f {
            Frame::Pong { id, timestamp_us } => self.pong = Some((id, timestamp_us)),
            Frame::TelemetryAck { seq } => {
                self.telemetry_acks.insert(seq);
            }
            f => self.frames.push_back(f),
        }
    }

    /// Ahead of everything queued (telemetry acknowledgements are always).
    pub(crate) fn push_front(&mut self, f: Frame) {
        match f {
            Frame::Pong { .. } | Frame::TelemetryAck { .. } => self.push_back(f),
            f => self.frames.push_front(f),
        }
    }

    pub(crate) fn extend(&mut self, frames: impl IntoIterator<Item = Frame>) {
        for f in frames {
            self.push_back(f);
        }
    }

    /// The next frame to write, without taking it.
    pub(crate) fn front(&self) -> Option<Frame> {
        if let Some(&seq) = self.telemetry_acks.first() {
            return Some(Frame::TelemetryAck { seq });
        }
        if let Some((id, timestamp_us)) = self.pong {
            return Some(Frame::Pong { id, timestamp_us });
        }
        self.frames.front().cloned()
    }

    /// Take the frame [`Self::front`] returned.
    pub(crate) fn pop_front(&mut self) -> Option<Frame> {
        if let Some(seq) = self.telemetry_acks.pop_first() {
            return Some(Frame::TelemetryAck { seq });
        }
        if let Some((id, timestamp_us)) = self.pong.take() {
            return Some(Frame::Pong { id, timestamp_us });
        }
        self.frames.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pongs_and_telemetry_acks_are_coalesced() {
        let mut q = CtrlQueue::default();
        for id in 0..1_000_000u64 {
            q.push_back(Frame::Pong { id, timestamp_us: id * 10 });
            q.push_front(Frame::TelemetryAck { seq: id % 3 });
        }
        assert_eq!(q.len(), 4);
        q.push_back(Frame::Reset { conn: crate::ids::ConnId(5), code: 1 });
        let got: Vec<Frame> = std::iter::from_fn(|| q.pop_front()).collect();
        assert_eq!(
            got,
            vec![
                Frame::TelemetryAck { seq: 0 },
                Frame::TelemetryAck { seq: 1 },
                Frame::TelemetryAck { seq: 2 },
                Frame::Pong { id: 999_999, timestamp_us: 9_999_990 },
                Frame::Reset { conn: crate::ids::ConnId(5), code: 1 },
            ]
        );
        assert!(q.is_empty());
    }
}
