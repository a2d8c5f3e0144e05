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
use std::sync::{Arc, Mutex};
use uext4::{Fs, Placed};

/// Batches handed over and not yet written.
const QUEUE: usize = 4;
/// Files sent at once (each holds a descriptor until written): one wake-up of the thread per
/// batch.
const BATCH: usize = 32;

/// A source file (its host path, for messages) and where its bytes go.
type Fill = (PathBuf, File, Vec<Placed>);

enum Msg {
    Fill(Vec<Fill>),
    /// Answer once everything sent before is written.
    Drain(SyncSender<()>),
}

/// The sending side; the thread ends when it is dropped.
pub(super) struct DataWriter {
    tx: Option<SyncSender<Msg>>,
    /// Files not yet sent.
    pending: std::cell::RefCell<Vec<Fill>>,
    /// The first failure of the thread, which then stops.
    failed: Arc<Mutex<Option<anyhow::Error>>>,
}

impl DataWriter {
    /// Starts the thread in `scope`.
    pub(super) fn start<'s>(scope: &'s std::thread::Scope<'s, '_>, fs: &'s Fs) -> DataWriter {
        let (tx, rx) = sync_channel(QUEUE);
        let failed = Arc::new(Mutex::new(None));
        let f = failed.clone();
        scope.spawn(move || run(fs, rx, &f));
        DataWriter {
            tx: Some(tx),
            pending: Default::default(),
            failed,
        }
    }

    /// Writes `file`'s bytes into `placed` (in order), later.
    pub(super) fn fill(&self, path: PathBuf, file: File, placed: Vec<Placed>) -> Result<()> {
        let full = {
            let mut p = self.pending.borrow_mut();
            p.push((path, file, placed));
            p.len() >= BATCH
        };
        match full {
            true => self.flush(),
            false => Ok(()),
        }
    }

    fn flush(&self) -> Result<()> {
        let batch = std::mem::take(&mut *self.pending.borrow_mut());
        match batch.is_empty() {
            true => Ok(()),
            false => self.send(Msg::Fill(batch)),
        }
    }

    /// Waits until everything handed over is written; the thread's failure, if any.
    pub(super) fn drain(&self) -> Result<()> {
        self.flush()?;
        let (tx, rx) = sync_channel(1);
        self.send(Msg::Drain(tx))?;
        rx.recv().map_err(|_| self.failure())
    }

    fn send(&self, m: Msg) -> Result<()> {
        let tx = self.tx.as_ref().expect("a running writer");
        tx.send(m).map_err(|_| self.failure())
    }

    fn failure(&self) -> anyhow::Error {
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .unwrap_or_else(|| anyhow!("the file data writer stopped"))
    }

    /// Drains, then ends the thread.
    pub(super) fn finish(mut self) -> Result<()> {
        let r = self.drain();
        self.tx = None;
        r
    }
}

/// The thread: writes until the sender is gone, or records its first failure and stops (the
/// queue goes with it, so a sender waiting on it wakes).
fn run(fs: &Fs, rx: Receiver<Msg>, failed: &Mutex<Option<anyhow::Error>>) {
    if let Err(e) = serve(fs, &rx) {
        *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
    }
}

fn serve(fs: &Fs, rx: &Receiver<Msg>) -> Result<()> {
    for m in rx {
        match m {
            Msg::Fill(batch) => {
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
            }
            Msg::Drain(ack) => {
                let _ = ack.send(());
            }
        }
    }
    Ok(())
}
