//! Snapshots of the engine's counters (the JSON object of `Fs::stats_json` and `uext4 stats`)
//! and the difference between two of them, so a test says "this fsync started no handle" as
//! `after.since(&before, "handles_started") == 0`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// One snapshot: counter name to value (integers; fractional values are left out).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats(pub BTreeMap<String, u64>);

impl Stats {
    /// Reads a JSON object of counters.
    pub fn parse(json: &str) -> Stats {
        let v: serde_json::Value = serde_json::from_str(json)
            .unwrap_or_else(|e| panic!("stats are not a JSON object ({e}): {json}"));
        let map = v
            .as_object()
            .unwrap_or_else(|| panic!("stats are not a JSON object: {json}"));
        Stats(
            map.iter()
                .filter_map(|(k, v)| v.as_u64().map(|n| (k.clone(), n)))
                .collect(),
        )
    }

    /// The counters of an open filesystem now.
    pub fn of(fs: &uext4::Fs) -> Stats {
        Stats::parse(&fs.stats_json())
    }

    /// The counters of the server behind a mount now (`uext4 stats MOUNTPOINT`).
    pub fn of_mount(bin: &str, mnt: &Path) -> Stats {
        let o = Command::new(bin).arg("stats").arg(mnt).output().unwrap();
        assert!(
            o.status.success(),
            "uext4 stats {}: {}",
            mnt.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        Stats::parse(&String::from_utf8_lossy(&o.stdout))
    }

    /// One counter; panics naming the counters there are when it is missing.
    pub fn get(&self, name: &str) -> u64 {
        *self.0.get(name).unwrap_or_else(|| {
            panic!(
                "no counter {name} (there are {:?})",
                self.0.keys().collect::<Vec<_>>()
            )
        })
    }

    /// How much a counter grew from `before` to this snapshot.
    pub fn since(&self, before: &Stats, name: &str) -> u64 {
        self.get(name) - before.get(name)
    }

    /// Every counter's growth from `before` (counters that fell, like free blocks, give 0).
    pub fn delta(&self, before: &Stats) -> Stats {
        Stats(
            self.0
                .iter()
                .map(|(k, &v)| {
                    (
                        k.clone(),
                        v.saturating_sub(before.0.get(k).copied().unwrap_or(0)),
                    )
                })
                .collect(),
        )
    }
}
