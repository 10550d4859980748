//! SVG plots of a report (plotters): throughput over time and the latency
//! percentile curve, both for the median repetition.

use crate::report::Report;
use plotters::prelude::*;
use std::path::Path;

/// File names of the plots written next to the report.
#[derive(Debug, Clone, Default)]
pub struct PlotFiles {
    pub throughput: Option<String>,
    pub latency: Option<String>,
}

pub fn write_plots(r: &Report, dir: &Path, stem: &str) -> anyhow::Result<PlotFiles> {
    let mut files = PlotFiles::default();
    let Some(run) = r.repetitions.get(r.aggregate.median_repetition) else { return Ok(files) };
    let name = format!("{stem}-throughput.svg");
    let s = &run.series;
    let mb =
        |v: &[u64]| v.iter().enumerate().map(|(i, b)| (i as f64 + 0.5, *b as f64 / 1e6)).collect::<Vec<_>>();
    let sent = mb(&s.sent_bytes);
    let recv = mb(&s.recv_bytes);
    if !sent.is_empty() || !recv.is_empty() {
        let title = format!("{}: throughput per second (rep {})", r.workload.name, run.repetition);
        line_chart(
            &dir.join(&name),
            &title,
            "seconds since start",
            "MB/s",
            &[("publish", &sent), ("consume", &recv)],
            false,
        )?;
        files.throughput = Some(name);
    }
    let name = format!("{stem}-latency.svg");
    // x = number of nines: 90 % -> 1, 99 % -> 2, 99.9 % -> 3 ...
    let nines = |c: &[(f64, f64)]| {
        c.iter()
            .filter(|(p, _)| *p >= 50.0)
            .map(|(p, us)| ((1.0 - p / 100.0).max(1e-6).log10().abs().min(6.0), us.max(1.0)))
            .collect::<Vec<_>>()
    };
    let publish = nines(&run.publish_latency.curve);
    let e2e = nines(&run.e2e_latency.curve);
    if !publish.is_empty() || !e2e.is_empty() {
        let title = format!("{}: latency by percentile (x: 1 = p90, 2 = p99, 3 = p99.9)", r.workload.name);
        line_chart(
            &dir.join(&name),
            &title,
            "nines",
            "latency us (log)",
            &[("publish", &publish), ("end-to-end", &e2e)],
            true,
        )?;
        files.latency = Some(name);
    }
    Ok(files)
}

fn line_chart(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[(&str, &Vec<(f64, f64)>)],
    log_y: bool,
) -> anyhow::Result<()> {
    let x_max = series.iter().flat_map(|(_, v)| v.iter().map(|p| p.0)).fold(1.0_f64, f64::max);
    let y_max = series.iter().flat_map(|(_, v)| v.iter().map(|p| p.1)).fold(1.0_f64, f64::max) * 1.1;
    let root = SVGBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let colors = [BLUE, RED, GREEN, MAGENTA];
    let mut builder = ChartBuilder::on(&root);
    builder.caption(title, ("sans-serif", 18)).margin(12).x_label_area_size(40).y_label_area_size(70);
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).draw()?;
            for (i, (label, points)) in series.iter().enumerate() {
                let color = colors[i % colors.len()];
                chart
                    .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))?
                    .label(*label)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            }
            chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
        }};
    }
    if log_y {
        draw!(builder.build_cartesian_2d(0.0..x_max, (1.0..y_max).log_scale())?);
    } else {
        draw!(builder.build_cartesian_2d(0.0..x_max, 0.0..y_max)?);
    }
    root.present()?;
    Ok(())
}
