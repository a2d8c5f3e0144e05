//! One data-path measurement: a system set up (image, mount or server), fio run on it, and
//! the system taken down.

use super::*;

/// The fuse module's switch for FUSE over io_uring.
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// The reference fio jobs, one per seed document (the workloads folder's README says which).
fn builtin_job(w: &str) -> Option<&'static str> {
    Some(match w {
        "overwrite-4k" => include_str!("workloads/overwrite-4k.fio"),
        "mixed-randrw-4k" => include_str!("workloads/mixed-randrw-4k.fio"),
        "fsync-randwrite-16k" => include_str!("workloads/fsync-randwrite-16k.fio"),
        _ => return None,
    })
}

impl Ctx {
    pub(crate) fn job_file(&self, w: &str) -> Result<PathBuf> {
        let text = match &self.wdir {
            Some(d) => {
                let src = d.join(format!("{w}.fio"));
                std::fs::read_to_string(&src).with_context(|| src.display().to_string())?
            }
            None => builtin_job(w)
                .with_context(|| format!("no built-in fio job for {w}"))?
                .to_string(),
        };
        let mut out = String::new();
        for line in text.lines() {
            let l = line.trim();
            let line = if self.quick && l.starts_with("size=") {
                "size=64m".to_string()
            } else if self.quick && l.starts_with("filesize=") {
                "filesize=4m".to_string()
            } else if l.starts_with("runtime=") {
                format!("runtime={}", self.runtime)
            } else if l.starts_with("ramp_time=") {
                if self.quick {
                    "ramp_time=0".to_string()
                } else {
                    line.to_string()
                }
            } else {
                line.to_string()
            };
            out.push_str(&line);
            out.push('\n');
        }
        let p = self.base.join(format!("{w}.fio"));
        std::fs::write(&p, out)?;
        Ok(p)
    }

    /// Image size in MiB: room for the workload's files (fsync-randwrite-16k: 28.8 MB per job).
    pub(crate) fn image_mib(&self, w: &str, jobs: usize) -> u64 {
        if w == "metadata" {
            self.meta_mib
        } else if self.quick {
            1024
        } else if w == "fsync-randwrite-16k" {
            (jobs as u64 * 30 + 2048).max(6144)
        } else {
            6144
        }
    }

    /// A fresh image with the same options for every system; returns its journal size in MiB.
    pub(crate) fn mke2fs(
        &self,
        img: &Path,
        journal_mib: Option<u32>,
        mib: u64,
    ) -> Result<Option<u32>> {
        let _ = std::fs::remove_file(img);
        let j = journal_mib
            .map(|m| format!("-J size={m}"))
            .unwrap_or_default();
        sh(&format!(
            "mke2fs -q -F -t ext4 -b 4096 {j} {} {mib}M",
            img.display()
        ))?;
        Ok(journal_size_of(img))
    }

    /// After a measurement: the engine's counters (uext4 mounts), the mount taken down, and
    /// e2fsck's verdict on its image (then removed); with the image's journal size.
    pub(crate) fn take_down(
        &self,
        system: &str,
        m: Mounted,
    ) -> (Option<serde_json::Value>, String, Option<u32>) {
        let stats = if system.starts_with("uext4-fuse") {
            Command::new(&self.exe)
                .arg("stats")
                .arg(&m.dir)
                .output()
                .ok()
                .and_then(|o| serde_json::from_slice(&o.stdout).ok())
        } else {
            None
        };
        let img = m.img.clone();
        let journal_mib = m.journal_mib;
        drop(m);
        let fsck = match &img {
            Some(i) => {
                let r = fsck(i);
                let _ = std::fs::remove_file(i);
                r
            }
            None => "-".into(),
        };
        (stats, fsck, journal_mib)
    }

    /// Mounts `system` for workload `w` on a fresh image.
    pub(crate) fn setup(
        &self,
        system: &str,
        w: &str,
        jobs: usize,
        journal: Option<u32>,
    ) -> Result<Mounted> {
        let mib = self.image_mib(w, jobs);
        let dir = self.base.join(format!("mnt-{system}"));
        let _ = Command::new("umount").arg(&dir).output();
        std::fs::create_dir_all(&dir)?;
        let img = self.base.join(format!("{system}.img"));
        match system {
            "raw" => {
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(&dir)?;
                Ok(Mounted {
                    dir,
                    img: None,
                    umount: false,
                    journal_mib: None,
                })
            }
            "fuse-null" | "fuse-mem" => {
                let mut c = Command::new(&self.bench_exe);
                let threads = std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(2)
                    .max(2);
                c.arg(if system == "fuse-null" {
                    "--serve-null"
                } else {
                    "--serve-mem"
                })
                .arg(&dir)
                .arg("--null-threads")
                .arg(threads.to_string())
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
                c.spawn()?;
                wait_mounted(&dir)?;
                Ok(Mounted {
                    dir,
                    img: None,
                    umount: true,
                    journal_mib: None,
                })
            }
            "kernel" | "kernel-dioread_lock" => {
                let journal_mib = self.mke2fs(&img, journal, mib)?;
                let opt = if system == "kernel" {
                    "loop"
                } else {
                    "loop,dioread_lock"
                };
                sh(&format!(
                    "mount -t ext4 -o {opt} {} {}",
                    img.display(),
                    dir.display()
                ))?;
                Ok(Mounted {
                    dir,
                    img: Some(img),
                    umount: true,
                    journal_mib,
                })
            }
            "fuse2fs" => {
                let journal_mib = self.mke2fs(&img, journal, mib)?;
                sh(&format!(
                    "fuse2fs {} {} -o fakeroot,allow_other >/dev/null 2>&1",
                    img.display(),
                    dir.display()
                ))?;
                wait_mounted(&dir)?;
                Ok(Mounted {
                    dir,
                    img: Some(img),
                    umount: true,
                    journal_mib,
                })
            }
            s if s.starts_with("uext4-fuse") => {
                let journal_mib = self.mke2fs(&img, journal, mib)?;
                let mut c = Command::new(&self.exe);
                c.arg("mount");
                match s {
                    "uext4-fuse-wbc" => {
                        c.args(["-o", "writeback_cache"]);
                    }
                    "uext4-fuse-dax" => {
                        c.args(["-o", "dax"]);
                    }
                    "uext4-fuse-nodax" => {
                        c.args(["-o", "nodax"]);
                    }
                    "uext4-fuse-unwritten" => {
                        c.args(["-o", "prealloc=unwritten"]);
                    }
                    "uext4-fuse-dev" => {
                        c.args(["-o", "transport=dev"]);
                    }
                    "uext4-fuse-uring" => {
                        c.args(["-o", "transport=uring"]);
                    }
                    "uext4-fuse-noopen" => {
                        c.args(["-o", "noatime,noopen"]);
                    }
                    _ => {}
                }
                // The kernel offers FUSE over io_uring only while the fuse module's switch is
                // on, and only INIT looks: on for this mount, then as it was (other programs
                // on the machine may rely on it).
                let switch = (s == "uext4-fuse-uring").then(|| {
                    let old = std::fs::read_to_string(ENABLE_URING).unwrap_or_default();
                    let _ = std::fs::write(ENABLE_URING, "Y");
                    old
                });
                let o = c.arg(&img).arg(&dir).output();
                if let Some(old) = switch.filter(|o| !o.trim().is_empty()) {
                    let _ = std::fs::write(ENABLE_URING, old.trim());
                }
                let o = o?;
                if !o.status.success() {
                    bail!("uext4 mount: {}", String::from_utf8_lossy(&o.stderr).trim());
                }
                Ok(Mounted {
                    dir,
                    img: Some(img),
                    umount: true,
                    journal_mib,
                })
            }
            other => bail!("system {other} is not a mount"),
        }
    }

    pub(crate) fn measure(
        &self,
        system: &str,
        w: &str,
        jobs: usize,
        journal: Option<u32>,
    ) -> Result<Record> {
        let label = journal_label(journal, self.journal_mib);
        if system == "memcpy" {
            let mib_s = loadgen::memcpy_pwrite_1g(&self.base, self.quick)?;
            return Ok(Record {
                system: system.into(),
                workload: w.into(),
                jobs,
                iops: mib_s,
                bw_mib_s: mib_s,
                p50_us: 0.0,
                p99_us: 0.0,
                fsck: "-".into(),
                stats: None,
                note: String::new(),
                journal: label,
                journal_mib: None,
                ..Default::default()
            });
        }
        if system.starts_with("uext4-lib") {
            let opts = uext4::MountOptions {
                dax: system.starts_with("uext4-lib-dax"),
                dax_non_temporal: system == "uext4-lib-dax-nt",
                buffered: system == "uext4-lib-buffered",
                map_tmpfs: system != "uext4-lib-nodax",
                ..Default::default()
            };
            let img = self.base.join("uext4-lib.img");
            let journal_mib = self.mke2fs(&img, journal, self.image_mib(w, jobs))?;
            let r = loadgen::run(
                &img,
                w,
                jobs,
                self.runtime,
                self.quick,
                self.written_layout,
                opts,
            )?;
            let fsck = fsck(&img);
            let _ = std::fs::remove_file(&img);
            return Ok(Record {
                system: system.into(),
                workload: w.into(),
                jobs,
                iops: r.iops,
                bw_mib_s: r.bw_mib_s,
                p50_us: r.p50_us,
                p99_us: r.p99_us,
                fsck,
                stats: serde_json::from_str(&r.stats).ok(),
                note: String::new(),
                journal: label,
                journal_mib,
                ..Default::default()
            });
        }
        let m = self.setup(system, w, jobs, journal)?;
        let dirs = m.dir.display().to_string();
        let (iops, bw, p50, p99) = if w == "pwrite-1g" {
            if !have("xfs_io") {
                bail!("xfs_io is not installed (apt-get install xfsprogs)");
            }
            let size = if self.quick { "64m" } else { "1g" };
            let mut secs = 0.0;
            for b in ["4k", "16m"] {
                let f = format!("{dirs}/pwrite-1g.dat");
                let _ = std::fs::remove_file(&f);
                for _phase in ["allocate", "overwrite"] {
                    let t0 = Instant::now();
                    sh(&format!(
                        "xfs_io -f -c 'pwrite -q -b {b} 0 {size}' -c fsync {f}"
                    ))?;
                    secs += t0.elapsed().as_secs_f64();
                }
                let _ = std::fs::remove_file(&f);
            }
            let mib = if self.quick { 64.0 } else { 1024.0 } * 4.0;
            (mib / secs, mib / secs, 0.0, 0.0)
        } else {
            let job = self.job_file(w)?;
            // fio's create_only lays a write-only job's files out with fallocate: every block
            // is unwritten, so a "random overwrite" run is mostly unwritten-to-written
            // conversions. overwrite-4k is about overwriting allocated, written blocks (R1;
            // workloads/README.md: "so overwrites really overwrite"), so its layout writes the
            // data (`--overwrite=1`, layout pass only; `--fallocated-layout` leaves fio's).
            // fsync-randwrite-16k keeps fio's fallocated layout: it measures that conversion
            // work (R4).
            // (uext4 on tmpfs has none: its fallocate maps zeroed blocks written, see
            // MountOptions::prealloc_zeroed; uext4-fuse-unwritten keeps the kernel's layout.)
            // mixed-randrw-4k reads, so fio writes its file out anyway.
            let fill = if w == "overwrite-4k" && self.written_layout {
                "--overwrite=1 "
            } else {
                ""
            };
            let layout = format!(
                "cd {dirs} && DIR={dirs} fio --create_only=1 {fill}--numjobs={jobs} {} >/dev/null 2>&1",
                job.display()
            );
            sh(&layout)?;
            let out = sh(&format!(
                "cd {dirs} && DIR={dirs} fio --output-format=json --numjobs={jobs} {}",
                job.display()
            ))?;
            parse_fio(&out)?
        };
        let (stats, fsck, journal_mib) = self.take_down(system, m);
        Ok(Record {
            system: system.into(),
            workload: w.into(),
            jobs,
            iops,
            bw_mib_s: bw,
            p50_us: p50,
            p99_us: p99,
            fsck,
            stats,
            note: String::new(),
            journal: label,
            journal_mib,
            ..Default::default()
        })
    }
}
