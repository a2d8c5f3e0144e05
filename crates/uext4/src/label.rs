//! The filesystem label (`s_volume_name`), as the kernel's FS_IOC_GETFSLABEL and
//! FS_IOC_SETFSLABEL on ext4 read and change it: up to 16 bytes, changed in a journal handle
//! in the primary superblock and in every backup (ext4_update_superblocks_fn), so that
//! e2fsck, blkid and a later mount all see the new one.

use crate::cred::Cred;
use crate::error::{Error, Result};
use crate::format::superblock::{Superblock, SUPERBLOCK_SIZE};
use crate::fs::Fs;
use std::sync::atomic::Ordering;

/// The longest label ext4 keeps (`EXT4_LABEL_MAX`).
pub const LABEL_MAX: usize = 16;

impl Fs {
    /// The label: `s_volume_name` up to its first NUL (FS_IOC_GETFSLABEL).
    pub fn label(&self) -> Vec<u8> {
        let sb = self.sb.lock();
        let b = &sb.bytes()[0x78..0x78 + LABEL_MAX];
        let end = b.iter().position(|&c| c == 0).unwrap_or(LABEL_MAX);
        b[..end].to_vec()
    }

    /// Sets the label for `cred` (FS_IOC_SETFSLABEL): EPERM unless privileged
    /// (CAP_SYS_ADMIN), EINVAL past 16 bytes. The primary superblock and each backup change
    /// in one handle.
    pub fn set_label_as(&self, cred: &Cred, label: &[u8]) -> Result<()> {
        if !cred.privileged {
            return Err(Error::Perm);
        }
        self.set_label(label)
    }

    /// Sets the label (as root: the image tools). A NUL ends it, as the kernel's strnlen.
    pub fn set_label(&self, label: &[u8]) -> Result<()> {
        self.stats.ops.fetch_add(1, Ordering::Relaxed);
        self.check_writable()?;
        let label = &label[..label.iter().position(|&c| c == 0).unwrap_or(label.len())];
        if label.len() > LABEL_MAX {
            return Err(Error::Invalid(format!(
                "a label has at most {LABEL_MAX} bytes, not {}",
                label.len()
            )));
        }
        let mut name = [0u8; LABEL_MAX];
        name[..label.len()].copy_from_slice(label);
        let backups: Vec<u32> = (1..self.geo.group_count)
            .filter(|&g| self.geo.group_has_super(g))
            .collect();
        let mut h = self.start(1 + backups.len())?;
        let set =
            |sb: &mut Superblock| sb.bytes_mut()[0x78..0x78 + LABEL_MAX].copy_from_slice(&name);
        let buf = self.superblock_to_buffer(set)?;
        h.dirty(&buf);
        for g in backups {
            let blk = self.geo.group_first_block(g);
            let buf = self.bcache.get(blk)?;
            {
                let mut d = buf.write();
                let mut sb = Superblock::from_bytes(&d[..SUPERBLOCK_SIZE]);
                if !sb.verify_csum() {
                    // A damaged backup is left as it is: e2fsck mends it from the primary.
                    tracing::warn!("backup superblock at block {blk}: bad checksum, not updated");
                    continue;
                }
                set(&mut sb);
                sb.set_csum();
                d[..SUPERBLOCK_SIZE].copy_from_slice(sb.bytes());
            }
            h.dirty(&buf);
        }
        let tid = h.tid();
        drop(h);
        // The label is seen by tools reading the device: make it durable now.
        self.commit_upto(tid)
    }
}
