//! File data into an image on a thread of its own: the copy places a new file's blocks
//! (`Fs::place_new_data`) and hands the open source file here, which fills them
//! (`Fs::fill_placed`: the kernel copies the bytes where it can). The thread that makes
//! entries thus never waits for file data.
//!
//! Placed data must be on the device before the engine commits the blocks that hold it: the
//! copy drains this queue ([`DataWriter::drain`]) before every commit it asks for and before
//! it replaces an entry.

use anyhow::{anyhow, Result};
use std::fs::File;
use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use uext4::{Fs, Placed};

/// Batches handed over and not yet taken by a thread.
const QUEUE: usize = 4;
/// Files sent at once (each holds a descriptor until written): one wake-up of a thread per
/// batch.
const BATCH: usize = 32;
/// Threads writing: the kernel's copying is most of the work of a build, and files are
/// independent of each other.
const THREADS: usize = 2;

/// A source file (its host path, for messages) and where its bytes go.
type Fill = (PathBuf, File, Vec<Placed>);

/// What the copy and the threads share.
#[derive(Default)]
struct Shared {
    /// Batches sent and not yet written.
    in_flight: Mutex<usize>,
    written: Condvar,
    /// The first failure; once set, the threads drop what they get unwritten.
    failed: Mutex<Option<anyhow::Error>>,
}

/// The sending side; the threads end when it is dropped.
pub(super) struct DataWriter {
    tx: Option<SyncSender<Vec<Fill>>>,
    /// Files not yet sent.
    pending: super::Gather<Fill, BATCH>,
    shared: Arc<Shared>,
}

impl DataWriter {
    /// Starts the threads in `scope`.
    pub(super) fn start<'s>(scope: &'s std::thread::Scope<'s, '_>, fs: &'s Fs) -> DataWriter {
        let (tx, rx) = sync_channel(QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        let shared = Arc::new(Shared::default());
        for _ in 0..THREADS {
            let (rx, shared) = (rx.clone(), shared.clone());
            scope.spawn(move || run(fs, &rx, &shared));
        }
        DataWriter {
            tx: Some(tx),
            pending: Default::default(),
            shared,
        }
    }

    /// Writes `file`'s bytes into `placed` (in order), later.
    pub(super) fn fill(&self, path: PathBuf, file: File, placed: Vec<Placed>) -> Result<()> {
        match self.pending.push((path, file, placed)) {
            true => self.flush(),
            false => Ok(()),
        }
    }

    fn flush(&self) -> Result<()> {
        let batch = self.pending.take();
        if batch.is_empty() {
            return Ok(());
        }
        *lock(&self.shared.in_flight) += 1;
        let tx = self.tx.as_ref().expect("running writers");
        if tx.send(batch).is_err() {
            *lock(&self.shared.in_flight) -= 1;
            return Err(anyhow!("the file data writers stopped"));
        }
        Ok(())
    }

    /// Waits until everything handed over is written; the first failure, if any.
    pub(super) fn drain(&self) -> Result<()> {
        self.flush()?;
        let mut n = lock(&self.shared.in_flight);
        while *n > 0 {
            n = self
                .shared
                .written
                .wait(n)
                .unwrap_or_else(|p| p.into_inner());
        }
        drop(n);
        match lock(&self.shared.failed).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Drains, then ends the threads.
    pub(super) fn finish(mut self) -> Result<()> {
        let r = self.drain();
        self.tx = None;
        r
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A thread: writes the batches it takes until the sender is gone.
fn run(fs: &Fs, rx: &Mutex<Receiver<Vec<Fill>>>, shared: &Shared) {
    loop {
        let Ok(batch) = lock(rx).recv() else {
            return;
        };
        if lock(&shared.failed).is_none() {
            if let Err(e) = write(fs, batch) {
                lock(&shared.failed).get_or_insert(e);
            }
        }
        *lock(&shared.in_flight) -= 1;
        shared.written.notify_all();
    }
}

fn write(fs: &Fs, batch: Vec<Fill>) -> Result<()> {
    for (path, file, placed) in batch {
        for p in &placed {
            let got = fs
                .fill_placed(p, &file, p.file_off)
                .map_err(|e| anyhow!("{}: {e}", path.display()))?;
            if got < p.len {
                let what = path.display();
                return Err(anyhow!("{what}: the file shrank while copied"));
            }
        }
    }
    Ok(())
}
