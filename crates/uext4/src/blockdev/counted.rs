//! A device wrapper that counts its traffic into counters shared with `Fs` (`uext4 stats`).

use super::{BlockDevice, IoCounters};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Wraps a device to count its traffic while sharing the counters with `Fs`.
pub(crate) struct Counted {
    pub(crate) inner: Arc<dyn BlockDevice>,
    pub(crate) io: Arc<IoCounters>,
}

impl BlockDevice for Counted {
    fn read_at(&self, off: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.io.count_read(buf.len());
        self.inner.read_at(off, buf)
    }
    fn write_at(&self, off: u64, buf: &[u8]) -> std::io::Result<()> {
        self.io.count_write(buf.len());
        self.inner.write_at(off, buf)
    }
    fn write_new_at(&self, off: u64, buf: &[u8]) -> std::io::Result<()> {
        self.io.count_write(buf.len());
        self.inner.write_new_at(off, buf)
    }
    fn copy_new_from(
        &self,
        off: u64,
        src: &std::fs::File,
        src_off: u64,
        len: u64,
    ) -> std::io::Result<u64> {
        let n = self.inner.copy_new_from(off, src, src_off, len)?;
        self.io.count_write(n as usize);
        Ok(n)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.io.flushes.fetch_add(1, Ordering::Relaxed);
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_only(&self) -> bool {
        self.inner.read_only()
    }
    fn is_mapped(&self) -> bool {
        self.inner.is_mapped()
    }
    fn zeroes_cheaply(&self) -> bool {
        self.inner.zeroes_cheaply()
    }
    fn zero_range(&self, off: u64, len: u64) -> std::io::Result<()> {
        // A punched hole moves no data: counted as device bytes only where zeros are written.
        if !self.inner.zeroes_cheaply() {
            self.io.count_write(len as usize);
        }
        self.inner.zero_range(off, len)
    }
    fn discard(&self, off: u64, len: u64) -> std::io::Result<bool> {
        self.inner.discard(off, len)
    }
    fn read_fresh_at(&self, off: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.io.count_read(buf.len());
        self.inner.read_fresh_at(off, buf)
    }
    fn name(&self) -> Option<String> {
        self.inner.name()
    }
    fn read_beneath_at(&self, off: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.io.count_read(buf.len());
        self.inner.read_beneath_at(off, buf)
    }
}
