//! uext4-lib: the workloads driven in-process through the library, in the shape of each fio job
//! (block size, files, jobs as threads, read/write mix, random offsets, fsync after each write).

use anyhow::Result;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uext4::{Fs, MountOptions};

pub struct LibResult {
    pub iops: f64,
    pub bw_mib_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub stats: String,
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// A file laid out with its data written (as fio writes out a file that a job reads, or one
/// laid out with `--overwrite=1`): the timed writes overwrite written blocks.
fn layout(fs: &Fs, name: &str, size: u64) -> Result<u32> {
    let ino = fs.create(2, name.as_bytes(), 0o644, 0, 0)?.ino;
    let chunk = vec![0x5au8; 1 << 20];
    let mut off = 0;
    while off < size {
        let n = (size - off).min(chunk.len() as u64) as usize;
        fs.write(ino, off, &chunk[..n])?;
        off += n as u64;
    }
    Ok(ino)
}

/// A file laid out as fio's create_only does for a write-only job: fallocated, so every
/// block is allocated but unwritten (the timed writes convert them, as through FUSE).
fn preallocate(fs: &Fs, name: &str, size: u64) -> Result<u32> {
    let ino = fs.create(2, name.as_bytes(), 0o644, 0, 0)?.ino;
    fs.fallocate(ino, 0, 0, size)?;
    Ok(ino)
}

/// The machine's memory-copy ceiling for pwrite-1g: the same passes (4 KiB and 16 MiB
/// buffers, allocate then overwrite, 1 GiB each) copied into a fresh shared mapping of a file
/// in `dir`, msync'd at the end of each pass as fsync would. MiB/s.
pub fn memcpy_pwrite_1g(dir: &Path, quick: bool) -> Result<f64> {
    let gib: u64 = if quick { 64 << 20 } else { 1 << 30 };
    let path = dir.join("memcpy.dat");
    let t0 = Instant::now();
    for bsz in [4096usize, 16 << 20] {
        let _ = std::fs::remove_file(&path);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        f.set_len(gib)?;
        // SAFETY: the file is ours alone (created above) and outlives the mapping.
        let mut map = unsafe { memmap2::MmapMut::map_mut(&f)? };
        let buf = vec![0x33u8; bsz];
        for _phase in 0..2 {
            for chunk in map.chunks_mut(bsz) {
                chunk.copy_from_slice(&buf[..chunk.len()]);
            }
            map.flush()?;
        }
    }
    let _ = std::fs::remove_file(&path);
    Ok(4.0 * gib as f64 / (1 << 20) as f64 / t0.elapsed().as_secs_f64())
}

/// Runs `workload` in-process on `img`, opened with `opts` (the system's mode: pread/pwrite,
/// DAX with cached or non-temporal copies, buffered).
pub fn run(
    img: &Path,
    workload: &str,
    jobs: usize,
    runtime: u64,
    quick: bool,
    written_layout: bool,
    opts: MountOptions,
) -> Result<LibResult> {
    let fs = Fs::open_path(img, opts)?;
    let gib: u64 = if quick { 64 << 20 } else { 1 << 30 };
    if workload == "pwrite-1g" {
        let t0 = Instant::now();
        for (i, bsz) in [4096usize, 16 << 20].into_iter().enumerate() {
            let ino = fs.create(2, format!("p{i}").as_bytes(), 0o644, 0, 0)?.ino;
            let buf = vec![0x33u8; bsz];
            for _phase in 0..2 {
                let mut off = 0u64;
                while off < gib {
                    fs.write(ino, off, &buf)?;
                    off += bsz as u64;
                }
                fs.fsync(ino, false)?;
            }
            fs.unlink(2, format!("p{i}").as_bytes())?;
        }
        let mib = 4.0 * gib as f64 / (1 << 20) as f64;
        let secs = t0.elapsed().as_secs_f64();
        let stats = fs.stats_json();
        fs.unmount()?;
        return Ok(LibResult {
            iops: mib / secs,
            bw_mib_s: mib / secs,
            p50_us: 0.0,
            p99_us: 0.0,
            stats,
        });
    }
    // Lay out the files as fio would, then time the job.
    let (files, bs, read_pct, fsync): (Vec<u32>, usize, u64, bool) = match workload {
        "overwrite-4k" => (
            (0..32)
                .map(|i| {
                    let name = format!("ow.{i}");
                    if written_layout {
                        layout(&fs, &name, gib / 32)
                    } else {
                        preallocate(&fs, &name, gib / 32)
                    }
                })
                .collect::<Result<_>>()?,
            4096,
            0,
            false,
        ),
        "mixed-randrw-4k" => (vec![layout(&fs, "mixed.dat", gib)?], 4096, 50, false),
        "fsync-randwrite-16k" => {
            let size = if quick {
                4 << 20
            } else {
                28_800_000u64 / 16384 * 16384
            };
            (
                (0..jobs)
                    .map(|j| preallocate(&fs, &format!("job{j}"), size))
                    .collect::<Result<_>>()?,
                16384,
                0,
                true,
            )
        }
        other => anyhow::bail!("no in-process shape for {other}"),
    };
    fs.sync()?;
    let sizes: Vec<u64> = files
        .iter()
        .map(|&i| fs.getattr(i).map(|a| a.size).unwrap_or(0))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(runtime);
    let files = Arc::new(files);
    let sizes = Arc::new(sizes);
    let handles: Vec<_> = (0..jobs)
        .map(|j| {
            let fs = fs.clone();
            let files = files.clone();
            let sizes = sizes.clone();
            std::thread::spawn(move || -> Result<(u64, Vec<u32>)> {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((j as u64 + 1) * 0x1234_5678));
                let mut buf = vec![0xA5u8; bs];
                let mut ops = 0u64;
                let mut lat = Vec::new();
                while Instant::now() < deadline {
                    let fi = if fsync {
                        j % files.len()
                    } else {
                        (rng.next() % files.len() as u64) as usize
                    };
                    let blocks = (sizes[fi] / bs as u64).max(1);
                    let off = (rng.next() % blocks) * bs as u64;
                    let t = Instant::now();
                    if read_pct > 0 && rng.next() % 100 < read_pct {
                        fs.read(files[fi], off, &mut buf)?;
                    } else {
                        fs.write(files[fi], off, &buf)?;
                        if fsync {
                            fs.fsync(files[fi], false)?;
                        }
                    }
                    if lat.len() < 1 << 20 {
                        lat.push(t.elapsed().as_nanos().min(u32::MAX as u128) as u32);
                    }
                    ops += 1;
                }
                Ok((ops, lat))
            })
        })
        .collect();
    let start = Instant::now();
    let mut ops = 0;
    let mut lat = Vec::new();
    for h in handles {
        let (o, l) = h
            .join()
            .map_err(|_| anyhow::anyhow!("a load thread panicked"))??;
        ops += o;
        lat.extend(l);
    }
    let secs = start.elapsed().as_secs_f64().max(runtime as f64);
    lat.sort_unstable();
    let pct = |p: f64| {
        if lat.is_empty() {
            0.0
        } else {
            lat[((lat.len() - 1) as f64 * p) as usize] as f64 / 1000.0
        }
    };
    let stats = fs.stats_json();
    fs.unmount()?;
    Ok(LibResult {
        iops: ops as f64 / secs,
        bw_mib_s: ops as f64 * bs as f64 / secs / (1 << 20) as f64,
        p50_us: pct(0.5),
        p99_us: pct(0.99),
        stats,
    })
}
