//! GPT partition tables, read with the `gpt` crate (the `gpt` feature): the primary header,
//! else the backup at the last sector, for 512- and 4096-byte logical blocks.

use super::{read_bytes, Partition, Scheme, Table};
use crate::blockdev::BlockDevice;
use crate::error::{Error, Result};
use std::io::{self, Read, Seek, SeekFrom};

/// GPT headers with more entries than this are refused (the usual array has 128).
const MAX_GPT_ENTRIES: u32 = 16384;

pub(super) fn read(dev: &dyn BlockDevice) -> Result<Option<Table>> {
    use gpt::disk::LogicalBlockSize;
    for lb in [LogicalBlockSize::Lb512, LogicalBlockSize::Lb4096] {
        let lbs = lb.as_u64();
        let size = dev.size();
        if size < 3 * lbs {
            continue;
        }
        let last = (size / lbs - 1) * lbs;
        let sig_at = |off| read_bytes(dev, off, 8).is_some_and(|b| b == b"EFI PART");
        // (reader base, which header) for the headers that are there.
        let mut candidates = Vec::new();
        if sig_at(lbs) {
            candidates.push((0, "primary"));
        }
        if sig_at(last) {
            candidates.push((last - lbs, "backup"));
        }
        if candidates.is_empty() {
            continue;
        }
        let mut why = Vec::new();
        for (base, which) in candidates {
            let mut r = DevReader { dev, base, pos: 0 };
            let h = match gpt::header::read_header_from_arbitrary_device(&mut r, lb) {
                Ok(h) => h,
                Err(e) => {
                    why.push(format!("{which} header: {e:?}"));
                    continue;
                }
            };
            if h.part_size != 128 {
                why.push(format!(
                    "{which} header: entries of {} bytes (only 128 are read)",
                    h.part_size
                ));
                continue;
            }
            if h.num_parts > MAX_GPT_ENTRIES {
                why.push(format!("{which} header: {} entries", h.num_parts));
                continue;
            }
            let mut r = DevReader {
                dev,
                base: 0,
                pos: 0,
            };
            let entries = match gpt::partition::file_read_partitions(&mut r, &h, lb) {
                Ok(p) => p,
                Err(e) => {
                    why.push(format!("{which} entries: {e}"));
                    continue;
                }
            };
            let mut partitions = Vec::new();
            for (n, p) in entries {
                if p.last_lba < p.first_lba || p.part_type_guid == gpt::partition_types::UNUSED {
                    continue;
                }
                let (Some(start), Some(len)) = (
                    p.first_lba.checked_mul(lbs),
                    (p.last_lba - p.first_lba)
                        .checked_add(1)
                        .and_then(|s| s.checked_mul(lbs)),
                ) else {
                    continue;
                };
                partitions.push(Partition {
                    number: n,
                    start,
                    len,
                    type_name: gpt_type_name(&p.part_type_guid.guid),
                    name: p.name.clone(),
                    extended: false,
                });
            }
            return Ok(Some(Table {
                scheme: Scheme::Gpt,
                sector_size: lbs,
                partitions,
            }));
        }
        return Err(Error::PartitionTable(format!(
            "a GPT header is there but damaged ({})",
            why.join("; ")
        )));
    }
    Ok(None)
}

/// A `Read + Seek` view of a device for the table crates, `base` bytes in (used to read the
/// GPT backup header with the crate's primary-header reader). Writes are refused.
struct DevReader<'a> {
    dev: &'a dyn BlockDevice,
    base: u64,
    pos: u64,
}

impl std::fmt::Debug for DevReader<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevReader(base {}, pos {})", self.base, self.pos)
    }
}

impl Read for DevReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let size = self.dev.size();
        let Some(at) = self.base.checked_add(self.pos).filter(|&a| a < size) else {
            return Ok(0);
        };
        let n = (buf.len() as u64).min(size - at) as usize;
        self.dev.read_at(at, &mut buf[..n])?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for DevReader<'_> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let end = self.dev.size().saturating_sub(self.base);
        let new = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => end.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        match new {
            Some(p) => {
                self.pos = p;
                Ok(p)
            }
            None => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "seek before the start of the device",
            )),
        }
    }
}

impl io::Write for DevReader<'_> {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        Err(io::Error::from_raw_os_error(libc::EROFS))
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn gpt_type_name(guid: &impl std::fmt::Display) -> String {
    let g = guid.to_string().to_ascii_uppercase();
    let name = match g.as_str() {
        "0FC63DAF-8483-4772-8E79-3D69D8477DE4" => "Linux filesystem",
        "C12A7328-F81F-11D2-BA4B-00A0C93EC93B" => "EFI System",
        "21686148-6449-6E6F-744E-656564454649" => "BIOS boot",
        "0657FD6D-A4AB-43C4-84E5-0933C84B4F4F" => "Linux swap",
        "E6D6D379-F507-44C2-A23C-238F2A3DF928" => "Linux LVM",
        "A19D880F-05FC-4D3B-A006-743F0F84911E" => "Linux RAID",
        "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709" => "Linux root (x86-64)",
        "44479540-F297-41B2-9AF7-D131D5F0458A" => "Linux root (x86)",
        "B921B045-1DF0-41C3-AF44-4C6F280D3FAE" => "Linux root (ARM64)",
        "BC13C2FF-59E6-4262-A352-B275FD6F7172" => "Linux extended boot",
        "933AC7E1-2EB4-4F13-B844-0E14E2AEF915" => "Linux home",
        "3B8F8425-20E0-4F3B-907F-1A25A76F98E8" => "Linux server data",
        "EBD0A0A2-B9E5-4433-87C0-68B6B72699C7" => "Microsoft basic data",
        "E3C9E316-0B5C-4DB8-817D-F92DF00215AE" => "Microsoft reserved",
        "DE94BBA4-06D1-4D40-A16A-BFD50179D6AC" => "Windows recovery",
        _ => return g,
    };
    name.to_string()
}
