//! The report's charts: grouped bar charts drawn with the `plotters` crate (axes, labels, a
//! legend), labelled with a font compiled into the binary so that a chart looks the same on
//! every machine, fonts installed or not.

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};
use std::path::Path;

/// DejaVu Sans (fonts/LICENSE): plotters draws text only with a font it is given.
const FONT: &[u8] = include_bytes!("../fonts/DejaVuSans.ttf");

/// One color per system the harness knows (sixteen), so no two share one in a chart.
const PALETTE: [RGBColor; 16] = [
    RGBColor(0x4e, 0x79, 0xa7),
    RGBColor(0xf2, 0x8e, 0x2b),
    RGBColor(0xe1, 0x57, 0x59),
    RGBColor(0x76, 0xb7, 0xb2),
    RGBColor(0x59, 0xa1, 0x4f),
    RGBColor(0xed, 0xc9, 0x48),
    RGBColor(0xb0, 0x7a, 0xa1),
    RGBColor(0xff, 0x9d, 0xa7),
    RGBColor(0x9c, 0x75, 0x5f),
    RGBColor(0xba, 0xb0, 0xac),
    RGBColor(0x1f, 0x3a, 0x5f),
    RGBColor(0x8c, 0x2d, 0x04),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0x17, 0xbe, 0xcf),
    RGBColor(0x94, 0x67, 0xbd),
];

fn font() -> Result<()> {
    static ONCE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *ONCE.get_or_init(|| register_font("sans-serif", FontStyle::Normal, FONT).is_ok());
    ok.then_some(())
        .ok_or_else(|| anyhow!("the chart font could not be read"))
}

/// A PNG at `path`: for each job count (x axis) one bar per system (legend), `y_label` on the
/// y axis; a missing value leaves its place empty.
pub fn bars(
    path: &Path,
    title: &str,
    y_label: &str,
    systems: &[&str],
    jobs: &[usize],
    value: &dyn Fn(&str, usize) -> Option<f64>,
) -> Result<()> {
    font()?;
    let max = systems
        .iter()
        .flat_map(|s| jobs.iter().filter_map(|&j| value(s, j)))
        .fold(0.0f64, f64::max);
    let width = (200 + jobs.len() * (systems.len() * 14 + 24)).clamp(640, 1600) as u32;
    let root = BitMapBackend::new(path, (width, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let groups = jobs.len().max(1) as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(72)
        .right_y_label_area_size(0)
        .build_cartesian_2d(0.0..groups, 0.0..(max * 1.1).max(1.0))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(jobs.len() * 2 + 1)
        .x_label_formatter(&|x| {
            // A label at each group's middle only.
            let i = x.floor() as usize;
            if (x - x.floor() - 0.5).abs() < 1e-6 && i < jobs.len() {
                match jobs[i] {
                    1 => "1 job".to_string(),
                    n => format!("{n} jobs"),
                }
            } else {
                String::new()
            }
        })
        .x_desc("concurrent jobs")
        .y_desc(y_label)
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style(("sans-serif", 13))
        .draw()?;
    let slot = 0.8 / systems.len().max(1) as f64;
    for (si, sys) in systems.iter().enumerate() {
        let color = PALETTE[si % PALETTE.len()];
        let rects = jobs.iter().enumerate().filter_map(|(gi, &j)| {
            let v = value(sys, j)?;
            let x0 = gi as f64 + 0.1 + si as f64 * slot;
            Some(Rectangle::new(
                [(x0, 0.0), (x0 + slot * 0.9, v)],
                color.filled(),
            ))
        });
        chart
            .draw_series(rects)?
            .label(*sys)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 12))
        .draw()?;
    root.present()?;
    Ok(())
}
