//! Partition tables (GPT and MBR, with MBR's extended and logical partitions) and what a
//! device, or a part of one, seems to hold: an ext2/3/4 filesystem, another filesystem, a
//! disk image of another format (qcow2, VMDK, VHDX, VDI, VHD), or nothing known.
//!
//! GPT is parsed by the `gpt` crate, MBR by `mbr` here; this module only reads (nothing
//! here writes to the device). Partitions are numbered as fdisk and lsblk number them: a GPT
//! partition by its slot in the entry array from 1, an MBR primary partition by its slot
//! (1 to 4, gaps kept), and logical partitions from 5 in the order of their chain.
//!
//! ```no_run
//! use uext4::{blockdev::FileDevice, partition::Table, Fs, MountOptions};
//! let dev = FileDevice::open("disk.img".as_ref(), true)?;
//! let table = Table::read(&dev)?.expect("a partitioned disk");
//! let opts = MountOptions { region: Some(table.region_of(2)?), ..MountOptions::ro() };
//! let fs = Fs::open_path("disk.img".as_ref(), opts)?;
//! # Ok::<(), uext4::Error>(())
//! ```

#[cfg(feature = "gpt")]
mod gpt;
mod mbr;

use crate::blockdev::{BlockDevice, Region, RegionDevice};
use crate::error::{Error, Result};
use std::sync::Arc;

/// Which kind of partition table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// A GUID partition table.
    Gpt,
    /// An MBR (DOS) partition table.
    Mbr,
}

impl std::fmt::Display for Scheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Scheme::Gpt => "GPT",
            Scheme::Mbr => "MBR",
        })
    }
}

/// One partition of a table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    /// As fdisk and lsblk number it (from 1).
    pub number: u32,
    /// First byte on the device.
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
    /// The partition type, by name where it is a well-known one ("Linux filesystem", "EFI
    /// System"), else the GPT type GUID or the MBR type byte.
    pub type_name: String,
    /// The GPT partition name (empty for MBR).
    pub name: String,
    /// An MBR extended partition: the container of the logical partitions, no filesystem.
    pub extended: bool,
}

impl Partition {
    /// Where the partition lies, for [`crate::MountOptions::region`].
    pub fn region(&self) -> Region {
        Region {
            offset: self.start,
            len: Some(self.len),
        }
    }
}

/// A device's partition table.
#[derive(Clone, Debug)]
pub struct Table {
    /// Which kind of table.
    pub scheme: Scheme,
    /// The logical sector size the table counts in (512, or 4096 for a GPT written so).
    pub sector_size: u64,
    /// The partitions in use, by number.
    pub partitions: Vec<Partition>,
}

impl Table {
    /// Reads the partition table of `dev`: GPT if a GPT header is there (primary, else the
    /// backup at the last sector), else MBR if the boot signature is there. `None` when there
    /// is neither, or when the device starts with an ext2/3/4 superblock (a filesystem on the
    /// whole device, whose first sector is not a table whatever it holds).
    pub fn read(dev: &dyn BlockDevice) -> Result<Option<Table>> {
        if matches!(identify(dev), Contents::Ext { .. }) {
            return Ok(None);
        }
        // The crates are not written against hostile input throughout: a panic in them is
        // reported as a damaged table, never passed on.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if let Some(t) = gpt::read(dev)? {
                return Ok(Some(t));
            }
            read_mbr(dev)
        }));
        match r {
            Ok(r) => r,
            Err(_) => Err(Error::PartitionTable(
                "the partition table could not be parsed (damaged)".into(),
            )),
        }
    }

    /// Partition `number`, if the table has it.
    pub fn get(&self, number: u32) -> Option<&Partition> {
        self.partitions.iter().find(|p| p.number == number)
    }

    /// Where partition `number` lies; an error naming the partitions there are otherwise.
    pub fn region_of(&self, number: u32) -> Result<Region> {
        match self.get(number) {
            Some(p) if p.extended => Err(Error::PartitionTable(format!(
                "partition {number} is the extended partition (it holds the logical \
                 partitions, numbered from 5), not a filesystem"
            ))),
            Some(p) => Ok(p.region()),
            None => Err(Error::PartitionTable(format!(
                "partition {number} does not exist ({})",
                self.summary()
            ))),
        }
    }

    /// "the GPT partition table has 3 partitions: 1, 2, 3".
    pub fn summary(&self) -> String {
        let nums: Vec<String> = self
            .partitions
            .iter()
            .map(|p| p.number.to_string())
            .collect();
        match nums.len() {
            0 => format!("the {} partition table is empty", self.scheme),
            1 => format!(
                "the {} partition table has 1 partition: {}",
                self.scheme, nums[0]
            ),
            n => format!(
                "the {} partition table has {n} partitions: {}",
                self.scheme,
                nums.join(", ")
            ),
        }
    }
}

/// Without the `gpt` feature a GPT disk is named, not taken for an MBR one.
#[cfg(not(feature = "gpt"))]
mod gpt {
    use super::{read_bytes, Table};
    use crate::blockdev::BlockDevice;
    use crate::error::{Error, Result};

    pub(super) fn read(dev: &dyn BlockDevice) -> Result<Option<Table>> {
        let sig_at = |off| read_bytes(dev, off, 8).is_some_and(|b| b == b"EFI PART");
        if sig_at(512) || sig_at(4096) {
            return Err(Error::PartitionTable(
                "a GPT partition table, and this uext4 was built without the `gpt` feature".into(),
            ));
        }
        Ok(None)
    }
}

fn read_bytes(dev: &dyn BlockDevice, off: u64, len: usize) -> Option<Vec<u8>> {
    let mut b = vec![0u8; len];
    let end = off.checked_add(len as u64)?;
    (end <= dev.size() && dev.read_at(off, &mut b).is_ok()).then_some(b)
}

fn read_mbr(dev: &dyn BlockDevice) -> Result<Option<Table>> {
    let Some(entries) = mbr::read(dev)? else {
        return Ok(None);
    };
    let mut partitions = Vec::new();
    for (number, e) in entries {
        if e.sys == 0xee {
            return Err(Error::PartitionTable(
                "a protective MBR (GPT disk) whose GPT headers are both missing".into(),
            ));
        }
        partitions.push(Partition {
            number,
            start: e.start * 512,
            len: e.sectors * 512,
            type_name: mbr_type_name(e.sys),
            name: String::new(),
            extended: e.extended(),
        });
    }
    // A boot signature with no partition in use is a boot sector (or a filesystem's), not a
    // partition table.
    if partitions.is_empty() {
        return Ok(None);
    }
    Ok(Some(Table {
        scheme: Scheme::Mbr,
        sector_size: 512,
        partitions,
    }))
}

fn mbr_type_name(sys: u8) -> String {
    let name = match sys {
        0x83 => "Linux",
        0x82 => "Linux swap",
        0x8e => "Linux LVM",
        0xfd => "Linux raid autodetect",
        0x05 => "Extended",
        0x0f => "W95 Ext'd (LBA)",
        0x85 => "Linux extended",
        0x07 => "HPFS/NTFS/exFAT",
        0x0b => "W95 FAT32",
        0x0c => "W95 FAT32 (LBA)",
        0x06 => "FAT16",
        0x0e => "W95 FAT16 (LBA)",
        0xef => "EFI (FAT-12/16/32)",
        0xee => "GPT",
        _ => return format!("type {sys:#04x}"),
    };
    format!("{name} ({sys:#04x})")
}

/// What a device (or a [`RegionDevice`] onto part of one) seems to hold, from the
/// signatures at its start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Contents {
    /// An ext2, ext3 or ext4 superblock (magic 0xef53 at byte 1080).
    Ext {
        /// "ext2", "ext3" or "ext4", from the features (as blkid tells them apart).
        kind: &'static str,
        /// The volume label.
        label: String,
    },
    /// A disk image in a format other than raw: it must be converted or served as a block
    /// device first. The text says what it is and how to reach it.
    ImageFormat(&'static str),
    /// Another filesystem or known structure, by name ("XFS", "a partition table").
    Other(&'static str),
    /// Only zeros where the signatures would be.
    Zeros,
    /// Nothing recognised.
    Unknown,
}

impl std::fmt::Display for Contents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Contents::Ext { kind, label } if label.is_empty() => write!(f, "{kind}"),
            Contents::Ext { kind, label } => write!(f, "{kind} (label {label:?})"),
            Contents::ImageFormat(s) => f.write_str(s),
            Contents::Other(s) => f.write_str(s),
            Contents::Zeros => f.write_str("nothing (zeros)"),
            Contents::Unknown => f.write_str("unrecognised data"),
        }
    }
}

/// Looks at the signatures at the start of `dev` (the first 64 KiB and a few further
/// places); reads only, and a read that fails counts as nothing found there.
pub fn identify(dev: &dyn BlockDevice) -> Contents {
    use crate::format::features::*;
    let head = read_bytes(dev, 0, 4096.min(dev.size()) as usize).unwrap_or_default();
    let at = |off: usize, sig: &[u8]| head.get(off..off + sig.len()) == Some(sig);
    if let Some(sb) = read_bytes(dev, 1024, crate::format::superblock::SUPERBLOCK_SIZE) {
        let sb = crate::format::superblock::Superblock::from_bytes(&sb);
        if sb.magic() == crate::format::superblock::EXT4_MAGIC {
            let ext4 = INCOMPAT_EXTENTS | INCOMPAT_64BIT | INCOMPAT_FLEX_BG;
            let kind = if sb.feature_incompat() & ext4 != 0 {
                "ext4"
            } else if sb.has_compat(COMPAT_HAS_JOURNAL) {
                "ext3"
            } else {
                "ext2"
            };
            return Contents::Ext {
                kind,
                label: sb.volume_name(),
            };
        }
    }
    if let Some(f) = image_format(dev) {
        return Contents::ImageFormat(f);
    }
    let other = [
        (0, &b"XFSB"[..], "an XFS filesystem"),
        (0, b"hsqs", "a squashfs image"),
        (0, b"LUKS\xba\xbe", "a LUKS encrypted volume"),
        (3, b"NTFS    ", "an NTFS filesystem"),
        (3, b"EXFAT   ", "an exFAT filesystem"),
        (82, b"FAT32   ", "a FAT32 filesystem"),
        (54, b"FAT16   ", "a FAT16 filesystem"),
        (54, b"FAT12   ", "a FAT12 filesystem"),
        (512, b"LABELONE", "an LVM physical volume"),
        (0, b"SIF_MAGIC", "an Apptainer/Singularity SIF container"),
        (40, b"SIF_MAGIC", "an Apptainer/Singularity SIF container"),
    ];
    for (off, sig, name) in other {
        if at(off, sig) {
            return Contents::Other(name);
        }
    }
    if read_bytes(dev, 0x10040, 8).is_some_and(|b| b == b"_BHRfS_M") {
        return Contents::Other("a btrfs filesystem");
    }
    if at(4086, b"SWAPSPACE2") || at(4086, b"SWAP-SPACE") {
        return Contents::Other("Linux swap");
    }
    if read_bytes(dev, 0x8001, 5).is_some_and(|b| b == b"CD001") {
        return Contents::Other("an ISO 9660 filesystem");
    }
    if read_bytes(dev, 512, 8).is_some_and(|b| b == b"EFI PART") || at(510, &[0x55, 0xaa]) {
        return Contents::Other("a partition table or boot sector");
    }
    let probe = read_bytes(dev, 0, 65536.min(dev.size()) as usize).unwrap_or_default();
    if !probe.is_empty() && probe.iter().all(|&b| b == 0) {
        return Contents::Zeros;
    }
    Contents::Unknown
}

/// Whether `dev` starts as a disk image of a non-raw format, and if so what it is and how to
/// reach the disk inside it.
pub fn image_format(dev: &dyn BlockDevice) -> Option<&'static str> {
    let head = read_bytes(dev, 0, 512.min(dev.size()) as usize)?;
    let at = |off: usize, sig: &[u8]| head.get(off..off + sig.len()) == Some(sig);
    if at(0, b"QFI\xfb") {
        return Some(
            "a qcow2 image, not a raw disk: serve it with qemu-nbd (qemu-nbd -c /dev/nbd0 \
             IMAGE, then name /dev/nbd0) or convert it with qemu-img convert -O raw",
        );
    }
    if at(0, b"KDMV") || at(0, b"# Disk DescriptorFile") || at(0, b"COWD") {
        return Some(
            "a VMDK image, not a raw disk: serve it with qemu-nbd or convert it with qemu-img \
             convert -O raw",
        );
    }
    if at(0, b"vhdxfile") {
        return Some(
            "a VHDX image, not a raw disk: serve it with qemu-nbd or convert it with qemu-img \
             convert -O raw",
        );
    }
    if at(0x40, &[0x7f, 0x10, 0xda, 0xbe]) || at(0, b"<<< Oracle VM VirtualBox Disk Image >>>") {
        return Some(
            "a VDI (VirtualBox) image, not a raw disk: serve it with qemu-nbd or convert it \
             with qemu-img convert -O raw (or VBoxManage clonemedium --format RAW)",
        );
    }
    if at(0, b"conectix") {
        return Some(
            "a dynamic VHD image, not a raw disk: serve it with qemu-nbd or convert it with \
             qemu-img convert -O raw",
        );
    }
    None
}

/// What partition `p` of `dev` holds.
pub fn identify_partition(dev: &Arc<dyn BlockDevice>, p: &Partition) -> Contents {
    match RegionDevice::new(dev.clone(), p.region()) {
        Ok(d) => identify(&d),
        Err(_) => Contents::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blockdev::MemDevice;

    #[test]
    fn no_table_on_zeros_or_a_filesystem() {
        let d = MemDevice::new(1 << 20);
        assert!(Table::read(&d).unwrap().is_none());
        assert_eq!(identify(&d), Contents::Zeros);
    }

    #[test]
    fn an_mbr_is_read_and_numbered_by_slot() {
        let mut v = vec![0u8; 8 << 20];
        // Slot 1 empty, slot 2 Linux at sector 2048 for 4096 sectors, slot 4 swap.
        let entry = |v: &mut Vec<u8>, slot: usize, sys: u8, lba: u32, n: u32| {
            let o = 446 + 16 * (slot - 1);
            v[o + 4] = sys;
            v[o + 8..o + 12].copy_from_slice(&lba.to_le_bytes());
            v[o + 12..o + 16].copy_from_slice(&n.to_le_bytes());
        };
        entry(&mut v, 2, 0x83, 2048, 4096);
        entry(&mut v, 4, 0x82, 8192, 2048);
        v[510] = 0x55;
        v[511] = 0xaa;
        let d = MemDevice::from_vec(v);
        let t = Table::read(&d).unwrap().unwrap();
        assert_eq!(t.scheme, Scheme::Mbr);
        let nums: Vec<u32> = t.partitions.iter().map(|p| p.number).collect();
        assert_eq!(nums, [2, 4]);
        assert_eq!(
            t.region_of(2).unwrap(),
            Region {
                offset: 1 << 20,
                len: Some(2 << 20)
            }
        );
        let e = t.region_of(3).unwrap_err().to_string();
        assert!(e.contains("partition 3 does not exist"), "{e}");
        assert!(e.contains("2 partitions: 2, 4"), "{e}");
    }

    #[test]
    fn image_formats_are_named() {
        let mut v = vec![0u8; 4096];
        v[..4].copy_from_slice(b"QFI\xfb");
        let d = MemDevice::from_vec(v);
        assert!(matches!(identify(&d), Contents::ImageFormat(s) if s.starts_with("a qcow2")));
        assert!(Table::read(&d).unwrap().is_none());
    }
}
