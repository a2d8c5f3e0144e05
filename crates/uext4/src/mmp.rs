//! Multi-mount protection (incompat feature `mmp`), as the kernel's fs/ext4/mmp.c and
//! e2fsprogs' lib/ext2fs/mmp.c keep it: a filesystem on storage that several hosts can reach
//! is used read-write by one of them at a time.
//!
//! The MMP block (format::mmp) holds a sequence number that the node using the filesystem
//! rewrites every s_mmp_update_interval seconds; `MMP_SEQ_CLEAN` after a clean unmount and
//! `MMP_SEQ_FSCK` while e2fsck holds it. A read-write open (`protect`), before it writes
//! anything else (journal recovery included):
//! - refuses if the sequence is `MMP_SEQ_FSCK`;
//! - unless it is `MMP_SEQ_CLEAN`, waits 2 × the check interval + 1 seconds (at most the
//!   interval + 60; the check interval is s_mmp_update_interval, at least
//!   `MMP_MIN_CHECK_INTERVAL`, or the block's own mmp_check_interval if larger) and refuses if
//!   the sequence changed meanwhile: its owner is alive;
//! - writes a new random sequence with this host's name, waits as long again (no wait after a
//!   clean sequence, as the kernel), reads the block back and refuses if it changed: another
//!   node is taking it at the same time.
//!
//! Then a thread (the kernel's kmmpd) rewrites the block every update interval: the sequence
//! plus one, the time and this node's name, after checking that the block is still as it left
//! it. If another node has written it, the filesystem is multiply mounted: the thread stops
//! the filesystem (nothing more is committed; the journal is aborted) and writes the block no
//! more. At unmount, or when the open fails or the `Fs` goes, the thread stops and the block
//! gets `MMP_SEQ_CLEAN`. A read-only open writes nothing; it reads the block and warns if it
//! is in use.

use crate::blockdev::BlockDevice;
use crate::error::utc;
use crate::error::{Corruption, Error, Result};
use crate::format::features::INCOMPAT_MMP;
use crate::format::mmp::*;
use crate::format::superblock::Superblock;
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;

/// Stops the filesystem when another node has taken the MMP block (given the reason).
pub type TakenOver = Box<dyn Fn(&str) + Send + Sync>;
use std::time::{Duration, Instant};

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// This host's name (utsname nodename, as the kernel writes it).
fn hostname() -> String {
    let mut b = [0u8; 256];
    // SAFETY: gethostname writes at most `b.len()` bytes into the buffer we own.
    let r = unsafe { libc::gethostname(b.as_mut_ptr().cast(), b.len()) };
    if r != 0 {
        return "unknown host".into();
    }
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// A random sequence number no larger than `MMP_SEQ_MAX`.
fn new_seq() -> u32 {
    loop {
        let mut b = [0u8; 4];
        // SAFETY: getrandom writes at most 4 bytes into the buffer we own.
        let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
        let v = if n == 4 {
            u32::from_ne_bytes(b)
        } else {
            // No getrandom: time and pid, mixed.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            let x = (t ^ (std::process::id() as u64).rotate_left(32))
                .wrapping_mul(0x9E37_79B9_7F4A_7C15);
            (x >> 32) as u32
        };
        if v <= MMP_SEQ_MAX {
            return v;
        }
    }
}

/// The filesystem's MMP parameters, from its superblock.
struct Where {
    dev: Arc<dyn BlockDevice>,
    blk: u64,
    /// Byte offset of the block.
    off: u64,
    seed: Option<u32>,
    /// s_mmp_update_interval, in seconds (`MMP_UPDATE_INTERVAL` if zero).
    update_interval: u32,
}

impl Where {
    fn new(dev: &Arc<dyn BlockDevice>, sb: &Superblock) -> Result<Where> {
        let blk = sb.mmp_block();
        let bs = sb.block_size() as u64;
        let inside = blk > sb.first_data_block() as u64
            && blk < sb.blocks_count()
            && bs >= MMP_SIZE as u64
            && blk
                .checked_mul(bs)
                .and_then(|o| o.checked_add(bs))
                .is_some_and(|e| e <= dev.size());
        if !inside {
            return Err(Error::corrupt(
                Corruption::Superblock,
                format!(
                    "superblock: the MMP block ({blk}) is outside the filesystem; run e2fsck -f"
                ),
            ));
        }
        let update_interval = match sb.mmp_update_interval() as u32 {
            0 => MMP_UPDATE_INTERVAL,
            n => n,
        };
        Ok(Where {
            dev: dev.clone(),
            blk,
            off: blk * bs,
            seed: sb.has_metadata_csum().then(|| sb.csum_seed()),
            update_interval,
        })
    }

    /// Reads the block from the device (not a cache), checking its magic and checksum.
    fn read(&self) -> Result<MmpBlock> {
        let mut b = vec![0u8; MMP_SIZE];
        self.dev.read_fresh_at(self.off, &mut b)?;
        let m = MmpBlock::from_bytes(&b);
        if m.magic() != MMP_MAGIC {
            return Err(Error::corrupt(
                Corruption::Mmp,
                format!(
                    "MMP block {}: bad magic {:#x}; run e2fsck -f",
                    self.blk,
                    m.magic()
                ),
            ));
        }
        if !m.verify_csum(self.seed) {
            return Err(Error::bad_checksum(
                Corruption::Mmp,
                format!("MMP block {} (run e2fsck -f)", self.blk),
            ));
        }
        Ok(m)
    }

    /// Writes the block (checksum set) and makes it durable at once.
    fn write(&self, m: &mut MmpBlock) -> Result<()> {
        m.set_csum(self.seed);
        self.dev.write_at(self.off, m.bytes())?;
        self.dev.flush()?;
        Ok(())
    }
}

fn busy(m: &MmpBlock) -> Error {
    Error::MmpBusy {
        node: m.nodename(),
        device: m.bdevname(),
        time: m.time(),
        fsck: m.seq() == MMP_SEQ_FSCK,
    }
}

/// What the thread and the owner share.
struct Shared {
    at: Where,
    state: Mutex<State>,
    wake: Condvar,
    /// What stops the filesystem if another node writes the block (set by `start`; it must
    /// not keep the filesystem alive).
    on_taken_over: Mutex<Option<TakenOver>>,
}

struct State {
    /// The block as this node last wrote it.
    ours: MmpBlock,
    /// The thread is to finish.
    stop: bool,
    /// Another node wrote the block (or it could not be read): it is no longer ours to write.
    lost: bool,
    /// `MMP_SEQ_CLEAN` written: nothing more to do.
    released: bool,
}

/// This node's hold on a filesystem's MMP block, from a read-write open to its unmount. Owned
/// by `Fs`; dropping it releases the block (as the kernel's kmmpd writes it clean whenever
/// it stops).
pub struct Mmp {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// For a read-write open of a filesystem with the `mmp` feature: takes the MMP block, as the
/// kernel's ext4_multi_mount_protect (see the module comment), or refuses with
/// `Error::MmpBusy` (or the MMP block's corruption). This may sleep for twice the check
/// interval and more. Without the feature, `None`; for a read-only open, `None` after a
/// warning if the block says the filesystem is in use.
pub(crate) fn protect(
    dev: &Arc<dyn BlockDevice>,
    sb: &Superblock,
    read_only: bool,
) -> Result<Option<Mmp>> {
    if !sb.has_incompat(INCOMPAT_MMP) {
        return Ok(None);
    }
    if read_only {
        match Where::new(dev, sb).and_then(|at| at.read()) {
            Ok(m) if m.seq() != MMP_SEQ_CLEAN => {
                tracing::warn!("opened read-only while the MMP block says: {}", busy(&m))
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("opened read-only; the MMP block is unreadable: {e}"),
        }
        return Ok(None);
    }
    let at = Where::new(dev, sb)?;
    let mut m = at.read()?;
    let mut check = at.update_interval.max(MMP_MIN_CHECK_INTERVAL);
    check = check.max(m.check_interval() as u32);
    let wait = Duration::from_secs((2 * check + 1).min(check + 60) as u64);
    let seq = m.seq();
    let mut settle = Duration::ZERO;
    if seq == MMP_SEQ_FSCK {
        return Err(busy(&m));
    }
    if seq != MMP_SEQ_CLEAN {
        if wait.as_secs() > 4 * MMP_MIN_CHECK_INTERVAL as u64 {
            tracing::warn!(
                "MMP interval {} s is higher than expected: opening will take {} s",
                check,
                2 * wait.as_secs()
            );
        }
        tracing::info!(
            "MMP block {} was not left clean (node {}): waiting {} s to see whether it is in use",
            at.blk,
            m.nodename(),
            wait.as_secs()
        );
        std::thread::sleep(wait);
        m = at.read()?;
        if m.seq() != seq {
            return Err(busy(&m));
        }
        settle = wait;
    }
    let ours_seq = new_seq();
    m.set_seq(ours_seq);
    m.set_time(now_secs());
    m.set_nodename(&hostname());
    m.set_bdevname(&dev.name().unwrap_or_else(|| "uext4".into()));
    m.set_check_interval(
        (MMP_CHECK_MULT * at.update_interval).clamp(MMP_MIN_CHECK_INTERVAL, MMP_MAX_CHECK_INTERVAL)
            as u16,
    );
    at.write(&mut m)?;
    std::thread::sleep(settle);
    let back = at.read()?;
    if back.seq() != ours_seq {
        return Err(busy(&back));
    }
    Ok(Some(Mmp {
        shared: Arc::new(Shared {
            at,
            state: Mutex::new(State {
                ours: m,
                stop: false,
                lost: false,
                released: false,
            }),
            wake: Condvar::new(),
            on_taken_over: Mutex::new(None),
        }),
        thread: Mutex::new(None),
    }))
}

impl Mmp {
    /// Ties the hold to a filesystem (`on_taken_over` stops its writes if another node takes
    /// the block) and starts the updating thread if it is not running yet (a reopen after
    /// journal recovery keeps it).
    pub(crate) fn start(&self, on_taken_over: TakenOver) -> Result<()> {
        *self.shared.on_taken_over.lock() = Some(on_taken_over);
        if self.shared.state.lock().lost {
            return Err(Error::Stopped(
                "MMP: another node took the filesystem while it was being opened".into(),
            ));
        }
        let mut t = self.thread.lock();
        if t.is_none() {
            let shared = self.shared.clone();
            *t = Some(
                std::thread::Builder::new()
                    .name("uext4-mmp".into())
                    .spawn(move || run(&shared))?,
            );
        }
        Ok(())
    }

    /// Stops the thread and, unless another node has taken the block, writes it clean.
    /// Idempotent; at unmount.
    pub(crate) fn release(&self) -> Result<()> {
        self.shared.state.lock().stop = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.lock().take() {
            // The thread itself may drop the last `Fs` (its upgrade in `taken_over`): it
            // cannot wait for itself, and is finishing anyway.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
        let mut st = self.shared.state.lock();
        if st.lost || st.released {
            return Ok(());
        }
        st.released = true;
        st.ours.set_seq(MMP_SEQ_CLEAN);
        st.ours.set_time(now_secs());
        self.shared.at.write(&mut st.ours)
    }
}

impl Drop for Mmp {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            tracing::error!("MMP: could not write the MMP block clean: {e}");
        }
    }
}

/// The updating thread (the kernel's kmmpd).
fn run(shared: &Shared) {
    let interval = Duration::from_secs(shared.at.update_interval as u64);
    let mut check_interval = (MMP_CHECK_MULT * shared.at.update_interval)
        .clamp(MMP_MIN_CHECK_INTERVAL, MMP_MAX_CHECK_INTERVAL);
    let mut failed_writes = 0u64;
    loop {
        let started = Instant::now();
        let mut st = shared.state.lock();
        if st.stop {
            return;
        }
        // Is the block still as this node left it?
        let why = match shared.at.read() {
            Ok(disk)
                if disk.seq() == st.ours.seq()
                    && disk.nodename_bytes() == st.ours.nodename_bytes() =>
            {
                None
            }
            Ok(disk) => Some(format!(
                "the filesystem seems to be multiply mounted: the MMP block was rewritten by \
                 another node ({})",
                busy(&disk)
            )),
            Err(e) => Some(format!("the MMP block could not be checked: {e}")),
        };
        if let Some(why) = why {
            st.lost = true;
            drop(st);
            taken_over(shared, &why);
            return;
        }
        let seq = match st.ours.seq().wrapping_add(1) {
            s if s > MMP_SEQ_MAX || s == 0 => 1,
            s => s,
        };
        st.ours.set_seq(seq);
        st.ours.set_time(now_secs());
        st.ours.set_check_interval(check_interval as u16);
        if let Err(e) = shared.at.write(&mut st.ours) {
            if failed_writes.is_multiple_of(60) {
                tracing::error!("MMP: error writing the MMP block: {e}");
            }
            failed_writes += 1;
        }
        // Sleep out the interval (or until told to stop).
        let deadline = started + interval;
        while !st.stop && Instant::now() < deadline {
            shared.wake.wait_until(&mut st, deadline);
        }
        if st.stop {
            return;
        }
        drop(st);
        // As the kernel: advertise twice what a cycle took, within bounds, so that a node
        // waiting to see whether the block is in use waits long enough even under load.
        let took = started.elapsed().as_secs() as u32;
        check_interval =
            (MMP_CHECK_MULT * took).clamp(MMP_MIN_CHECK_INTERVAL, MMP_MAX_CHECK_INTERVAL);
    }
}

/// Another node writes the block: stop the filesystem as after a lost transaction, so that
/// nothing more of this node's reaches the device (the journal's contents stay for
/// recovery).
fn taken_over(shared: &Shared, why: &str) {
    let why = format!("MMP: {why}");
    tracing::error!("{why}");
    if let Some(stop) = &*shared.on_taken_over.lock() {
        stop(&why);
    }
}

/// The MMP block in words, as read now (`uext4 info`): `None` without the `mmp` feature.
pub fn describe(dev: &Arc<dyn BlockDevice>, sb: &Superblock) -> Option<String> {
    if !sb.has_incompat(INCOMPAT_MMP) {
        return None;
    }
    let at = match Where::new(dev, sb) {
        Ok(at) => at,
        Err(e) => return Some(e.to_string()),
    };
    Some(match at.read() {
        Ok(m) => format!(
            "block {}, update interval {} s, check interval {} s, {} (node {}, device {}, \
             at {})",
            at.blk,
            at.update_interval,
            m.check_interval(),
            seq_state(m.seq()),
            m.nodename(),
            m.bdevname(),
            utc(m.time())
        ),
        Err(e) => format!("block {}: {e}", at.blk),
    })
}

/// A sequence number in words.
pub fn seq_state(seq: u32) -> String {
    match seq {
        MMP_SEQ_CLEAN => "clean".into(),
        MMP_SEQ_FSCK => "e2fsck running".into(),
        s if s <= MMP_SEQ_MAX => format!("in use ({s:#x})"),
        s => format!("unknown ({s:#x})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_700_000_000), "2023-11-14 22:13:20 UTC");
    }

    #[test]
    fn new_seqs_are_live() {
        for _ in 0..100 {
            assert!(new_seq() <= MMP_SEQ_MAX);
        }
    }
}
