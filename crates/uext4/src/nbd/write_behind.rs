//! Write-behind: an NBD write returns once it is sent, not once it is answered.
//!
//! A write to a local image file returns when the page cache holds it, and is durable only
//! after a flush; an NBD write is no different in what it promises (the protocol makes a
//! write durable only at `NBD_CMD_FLUSH`), so waiting for each write's reply bought nothing
//! but a network round trip per write. Here the writer goes on as soon as its request is on
//! the wire, and what the round trip used to guarantee is kept in three places:
//! - order: a server may carry out requests in any order, so a read or a write that overlaps
//!   a write still in flight waits for that write's reply first;
//! - durability: a flush waits for the replies of every write sent before it, then sends
//!   `NBD_CMD_FLUSH` (which covers the writes the server has answered);
//! - failure: a write the server fails, or one lost with its connection, makes the device
//!   failed for good; every later read, write and flush returns that error, so the engine
//!   stops the filesystem and fsync reports it (as a failed write-back of the page cache
//!   reports at fsync), and the next open recovers from the journal.
//!
//! The bytes in flight are bounded, so a server that falls behind slows the writers rather
//! than growing its queue without end.

use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, BTreeSet};
use std::io;

/// The most bytes of writes in flight at once (one larger write still goes alone).
const MAX_BYTES_IN_FLIGHT: u64 = 32 << 20;

/// The writes in flight on every connection of one device.
pub(super) struct WriteBehind {
    state: Mutex<State>,
    changed: Condvar,
    /// The longest write ever sent, so an overlap search knows how far back to look.
    max_len: u64,
}

#[derive(Default)]
struct State {
    /// (offset, sequence number) -> length, for every write sent and not yet answered.
    flying: BTreeMap<(u64, u64), u64>,
    /// The sequence numbers in flight (a flush waits for those below its own).
    seqs: BTreeSet<u64>,
    next_seq: u64,
    bytes: u64,
    /// Why the device failed, once a write in flight failed or was lost.
    failed: Option<String>,
}

impl State {
    fn overlaps(&self, off: u64, len: u64, max_len: u64) -> bool {
        let end = off.saturating_add(len);
        self.flying
            .range((off.saturating_sub(max_len), 0)..(end, 0))
            .any(|(&(o, _), &l)| o + l > off)
    }

    fn check(&self) -> io::Result<()> {
        match &self.failed {
            Some(why) => Err(io::Error::other(why.clone())),
            None => Ok(()),
        }
    }
}

/// A write registered as in flight: its place in the order.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ticket {
    pub(super) off: u64,
    pub(super) len: u64,
    seq: u64,
}

impl WriteBehind {
    /// For a device whose writes are at most `max_len` bytes each.
    pub(super) fn new(max_len: u64) -> WriteBehind {
        WriteBehind {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            max_len,
        }
    }

    /// Registers a write of `off..off + len` about to be sent: waits until no write in flight
    /// overlaps it and the bytes in flight leave room. Fails once the device has failed.
    pub(super) fn begin(&self, off: u64, len: u64) -> io::Result<Ticket> {
        let mut s = self.state.lock();
        loop {
            s.check()?;
            let room = s.bytes == 0 || s.bytes + len <= MAX_BYTES_IN_FLIGHT;
            if room && !s.overlaps(off, len, self.max_len) {
                break;
            }
            self.changed.wait(&mut s);
        }
        let seq = s.next_seq;
        s.next_seq += 1;
        s.flying.insert((off, seq), len);
        s.seqs.insert(seq);
        s.bytes += len;
        Ok(Ticket { off, len, seq })
    }

    /// A write's end: answered (`None`), or failed or lost (`Some(why)`): then the device has
    /// failed.
    pub(super) fn end(&self, t: Ticket, failure: Option<String>) {
        let mut s = self.state.lock();
        if s.flying.remove(&(t.off, t.seq)).is_some() {
            s.seqs.remove(&t.seq);
            s.bytes -= t.len;
        }
        if let Some(why) = failure {
            s.failed.get_or_insert(why);
        }
        drop(s);
        self.changed.notify_all();
    }

    /// Waits until no write in flight overlaps `off..off + len` (before a read of it, or a
    /// zeroing request). Fails once the device has failed.
    pub(super) fn settle(&self, off: u64, len: u64) -> io::Result<()> {
        let mut s = self.state.lock();
        loop {
            s.check()?;
            if !s.overlaps(off, len, self.max_len) {
                return Ok(());
            }
            self.changed.wait(&mut s);
        }
    }

    /// Waits until every write sent before this call is answered (before a flush, or before
    /// the connections close). Fails once the device has failed.
    pub(super) fn drain(&self) -> io::Result<()> {
        let mut s = self.state.lock();
        let upto = s.next_seq;
        loop {
            s.check()?;
            match s.seqs.first() {
                Some(&first) if first < upto => self.changed.wait(&mut s),
                _ => return Ok(()),
            }
        }
    }

    /// Whether the device has failed.
    #[cfg(test)]
    pub(super) fn failed(&self) -> bool {
        self.state.lock().failed.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn an_overlapping_write_waits_for_the_one_in_flight_and_a_disjoint_one_does_not() {
        let wb = Arc::new(WriteBehind::new(1 << 20));
        let a = wb.begin(4096, 8192).unwrap();
        // Disjoint on both sides: no wait.
        let b = wb.begin(0, 4096).unwrap();
        let c = wb.begin(12288, 4096).unwrap();
        let w = wb.clone();
        let t = std::thread::spawn(move || w.begin(8192, 4096).map(|t| t.off));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!t.is_finished(), "an overlapping write did not wait");
        wb.end(a, None);
        assert_eq!(t.join().unwrap().unwrap(), 8192);
        wb.end(b, None);
        wb.end(c, None);
    }

    #[test]
    fn drain_waits_for_earlier_writes_only_and_a_failure_sticks() {
        let wb = Arc::new(WriteBehind::new(1 << 20));
        let a = wb.begin(0, 4096).unwrap();
        let w = wb.clone();
        let t = std::thread::spawn(move || w.drain());
        std::thread::sleep(Duration::from_millis(50));
        assert!(!t.is_finished(), "drain did not wait for a write in flight");
        // A write sent after the drain began does not hold it up.
        let later = wb.begin(1 << 20, 4096).unwrap();
        wb.end(a, None);
        t.join().unwrap().unwrap();
        wb.end(later, Some("the NBD server failed a write".into()));
        assert!(wb.failed());
        assert!(wb.begin(0, 4096).is_err());
        assert!(wb.settle(0, 4096).is_err());
        assert!(wb.drain().is_err());
    }

    #[test]
    fn bytes_in_flight_are_bounded() {
        let wb = Arc::new(WriteBehind::new(MAX_BYTES_IN_FLIGHT));
        let big = wb.begin(0, MAX_BYTES_IN_FLIGHT).unwrap();
        let w = wb.clone();
        let t = std::thread::spawn(move || w.begin(MAX_BYTES_IN_FLIGHT, 4096).map(|t| t.len));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!t.is_finished(), "a write went past the bound");
        wb.end(big, None);
        assert_eq!(t.join().unwrap().unwrap(), 4096);
    }
}
