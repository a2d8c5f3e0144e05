//! The data-path report: a Markdown section per workload, the journal comparison.

use super::*;

pub(crate) fn bar(v: f64, max: f64, width: usize) -> String {
    let n = if max > 0.0 {
        ((v / max) * width as f64).round() as usize
    } else {
        0
    };
    "#".repeat(n.min(width))
}

pub(crate) fn report(
    records: &[Record],
    skipped: &[String],
    runtime: u64,
    repeat: usize,
    out: &Path,
) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "# uext4 bench\n\nOne run, side by side; {runtime} s per measurement; IOPS (pwrite-1g: \
         MiB/s including fsync). Ratios are taken at the largest job count measured: to the \
         kernel's ext4 (same journal) and to the two ceilings, raw (fio on the same storage) and \
         fuse-null (the FUSE transport doing no work).\n\n"
    ));
    if repeat > 1 {
        s.push_str(&format!(
            "Every point measured {repeat} times, the systems interleaved (rotated every round); \
             each cell is the median run, and the spread (largest run / smallest) follows each \
             table.\n\n"
        ));
    }
    if !skipped.is_empty() {
        s.push_str(&format!("Skipped: {}\n\n", skipped.join("; ")));
    }
    // Sections: one per workload, and for the fsync workload one per journal size.
    let mut sections: Vec<(String, String)> = Vec::new();
    for r in records {
        let key = (r.workload.clone(), r.journal.clone());
        if (r.system != "raw" && r.system != "fuse-null" || r.journal == "default")
            && !sections.contains(&key)
        {
            sections.push(key);
        }
    }
    let multi_journal = |w: &str| {
        records
            .iter()
            .filter(|r| r.workload == w)
            .any(|r| r.journal != "default")
    };
    for (w, journal) in &sections {
        section(&mut s, records, w, journal, multi_journal(w), repeat, out);
    }
    journal_comparison(&mut s, records, &sections);
    s
}

/// One workload's (and journal's) table, ASCII chart, PNG chart, spread and notes.
pub(crate) fn section(
    s: &mut String,
    records: &[Record],
    w: &str,
    journal: &str,
    multi: bool,
    repeat: usize,
    out: &Path,
) {
    let in_section = |r: &&Record| {
        r.workload == *w && (r.journal == *journal || r.system == "raw" || r.system == "fuse-null")
    };
    let rs: Vec<&Record> = records.iter().filter(in_section).collect();
    let sizes: Vec<u32> = {
        let mut v: Vec<u32> = rs.iter().filter_map(|r| r.journal_mib).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let jtitle = if multi {
        format!(
            ", journal {journal}{}",
            match sizes.as_slice() {
                [m] if journal == "default" => format!(" ({m} MiB)"),
                _ => String::new(),
            }
        )
    } else {
        String::new()
    };
    s.push_str(&format!("## {w}{jtitle}\n\n"));
    let mut js: Vec<usize> = rs.iter().map(|r| r.jobs).collect();
    js.sort_unstable();
    js.dedup();
    s.push_str("| system |");
    for j in &js {
        s.push_str(&format!(" {j} jobs |"));
    }
    s.push_str(" p99 us | vs kernel | vs raw | vs fuse-null | e2fsck |\n|---|");
    for _ in &js {
        s.push_str("---|");
    }
    s.push_str("---|---|---|---|---|\n");
    let find = |sys: &str, j: usize| rs.iter().find(|r| r.system == sys && r.jobs == j);
    let get = |sys: &str, j: usize| find(sys, j).map(|r| r.iops).filter(|&v| v > 0.0);
    let mut systems: Vec<&str> = Vec::new();
    for r in &rs {
        if !systems.contains(&r.system.as_str()) {
            systems.push(r.system.as_str());
        }
    }
    let lastj = *js.last().unwrap_or(&1);
    for sys in &systems {
        s.push_str(&format!("| {sys} |"));
        for &j in &js {
            match get(sys, j) {
                Some(v) => s.push_str(&format!(" {v:.0} |")),
                None => s.push_str(" - |"),
            }
        }
        let ratio = |other: &str| match (get(sys, lastj), get(other, lastj)) {
            (Some(a), Some(b)) => format!("{:.2}x", a / b),
            _ => "-".into(),
        };
        let p99 = find(sys, lastj)
            .filter(|r| r.p99_us > 0.0)
            .map(|r| format!("{:.0}", r.p99_us))
            .unwrap_or_else(|| "-".into());
        // The worst e2fsck result over the sweep.
        let fs = rs
            .iter()
            .filter(|r| r.system == *sys)
            .map(|r| r.fsck.clone())
            .find(|f| f != "clean" && f != "-")
            .or_else(|| rs.iter().find(|r| r.system == *sys).map(|r| r.fsck.clone()))
            .unwrap_or_default();
        s.push_str(&format!(
            " {p99} | {} | {} | {} | {} |\n",
            ratio("kernel"),
            ratio("raw"),
            ratio("fuse-null"),
            fs.replace('|', "/")
        ));
    }
    s.push_str(&format!("\nRatios and p99 at {lastj} jobs.\n\n```\n"));
    let max = rs.iter().map(|r| r.iops).fold(0.0, f64::max);
    for sys in &systems {
        for &j in &js {
            if let Some(v) = get(sys, j) {
                s.push_str(&format!(
                    "{sys:>20} {j:>3} | {:<50} {v:.0}\n",
                    bar(v, max, 50)
                ));
            }
        }
    }
    s.push_str("```\n\n");
    let png = if journal == "default" {
        format!("{w}.png")
    } else {
        format!("{w}-j{}.png", journal.replace(" MiB", ""))
    };
    let title = format!("{w}{jtitle}");
    let value = |sys: &str, j: usize| get(sys, j);
    match chart::bars(&out.join(&png), &title, "IOPS", &systems, &js, &value) {
        Ok(()) => s.push_str(&format!(
            "![{w}: IOPS by job count, one bar per system]({png})\n\n"
        )),
        Err(e) => s.push_str(&format!("(no chart: {e})\n\n")),
    }
    if repeat > 1 {
        spread(s, &systems, &js, &find);
    }
    engine_notes(s, w, &rs);
}

/// Each system's spread (largest run / smallest) by job count.
pub(crate) fn spread<'a>(
    s: &mut String,
    systems: &[&str],
    js: &[usize],
    find: &dyn Fn(&str, usize) -> Option<&'a &'a Record>,
) {
    s.push_str("Spread (largest run / smallest), by job count:\n\n");
    for sys in systems {
        let spreads: Vec<String> = js
            .iter()
            .filter_map(|&j| find(sys, j))
            .map(|r| {
                let lo = r.runs.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = r.runs.iter().copied().fold(0.0, f64::max);
                if lo > 0.0 {
                    format!("{:.2}", hi / lo)
                } else {
                    "-".into()
                }
            })
            .collect();
        s.push_str(&format!("- {sys}: {}\n", spreads.join(", ")));
    }
    s.push('\n');
}

/// What the engine did in each run reported on: for the fsync workload the mix of first
/// writes into fallocated blocks (a journal handle each) and overwrites (none) differs with
/// the job count (fio writes every block once before any twice); and every run's note.
pub(crate) fn engine_notes(s: &mut String, w: &str, rs: &[&Record]) {
    for r in rs.iter() {
        let counter = |k: &str| r.stats.as_ref().and_then(|v| v[k].as_u64());
        if let (Some(a), Some(o), Some(c)) = (
            counter("allocating_writes"),
            counter("overwrites"),
            counter("commits"),
        ) {
            if w == "fsync-randwrite-16k" {
                s.push_str(&format!(
                    "- {} {} jobs: {a} allocating or converting writes, {o} overwrites, {c} commits\n",
                    r.system, r.jobs
                ));
            }
        }
    }
    for r in rs.iter().filter(|r| !r.note.is_empty()) {
        s.push_str(&format!("- {} {} jobs: {}\n", r.system, r.jobs, r.note));
    }
    s.push('\n');
}

/// The small journal against the default one, system by system (the fsync target: within 10%).
pub(crate) fn journal_comparison(
    s: &mut String,
    records: &[Record],
    sections: &[(String, String)],
) {
    let multi_journal = |w: &str| {
        records
            .iter()
            .filter(|r| r.workload == w)
            .any(|r| r.journal != "default")
    };
    for w in WORKLOADS.iter().filter(|w| multi_journal(w)) {
        let variants: Vec<String> = sections
            .iter()
            .filter(|(sw, j)| sw == w && j != "default")
            .map(|(_, j)| j.clone())
            .collect();
        for v in variants {
            let mut js: Vec<usize> = records
                .iter()
                .filter(|r| r.workload == *w)
                .map(|r| r.jobs)
                .collect();
            js.sort_unstable();
            js.dedup();
            s.push_str(&format!(
                "## {w}: journal {v} against the default journal (IOPS ratio)\n\n| system |"
            ));
            for j in &js {
                s.push_str(&format!(" {j} jobs |"));
            }
            s.push_str("\n|---|");
            for _ in &js {
                s.push_str("---|");
            }
            s.push('\n');
            let mut systems: Vec<&str> = Vec::new();
            for r in records
                .iter()
                .filter(|r| r.workload == *w && r.journal == v)
            {
                if !systems.contains(&r.system.as_str()) {
                    systems.push(r.system.as_str());
                }
            }
            for sys in systems {
                s.push_str(&format!("| {sys} |"));
                for &j in &js {
                    let get = |jl: &str| {
                        records
                            .iter()
                            .find(|r| {
                                r.workload == *w
                                    && r.system == sys
                                    && r.jobs == j
                                    && r.journal == jl
                            })
                            .map(|r| r.iops)
                            .filter(|&x| x > 0.0)
                    };
                    match (get(&v), get("default")) {
                        (Some(a), Some(b)) => s.push_str(&format!(" {:.2} |", a / b)),
                        _ => s.push_str(" - |"),
                    }
                }
                s.push('\n');
            }
            s.push('\n');
        }
    }
}
