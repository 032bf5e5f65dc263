//! `loss.png` beside a run's metrics CSV: train and validation loss, the learning rate and
//! the gradient norm against step, one panel each, drawn with plotters. The font ships
//! inside the binary (DejaVu Sans, `assets/fonts`), so the picture needs no system fonts.

use anyhow::Context;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};
use std::path::{Path, PathBuf};
use std::sync::Once;

/// The embedded font, registered as plotters' "sans-serif" (the family its labels ask for).
const FONT: &[u8] = include_bytes!("../assets/fonts/DejaVuSans.ttf");

/// Width and height of the picture in pixels.
const SIZE: (u32, u32) = (900, 960);

/// The panels, top to bottom: the y axis's name and the columns drawn in it.
const PANELS: [(&str, &[&str]); 3] = [
    ("loss", &["train_loss", "val_loss"]),
    ("learning rate", &["lr"]),
    ("gradient norm", &["grad_norm"]),
];

/// One named line: (step, value) points.
#[derive(Debug)]
pub struct Curve {
    /// The legend entry.
    pub name: String,
    /// (step, value), in step order.
    pub points: Vec<(f64, f64)>,
}

/// The curves of the columns `names` of a metrics CSV that it has (found by their header
/// names; empty cells, such as `val_loss` on steps without validation, are no points).
pub fn read_curves(csv: &Path, names: &[&str]) -> anyhow::Result<Vec<Curve>> {
    let text =
        std::fs::read_to_string(csv).with_context(|| format!("reading {}", csv.display()))?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let column = |name: &str| header.iter().position(|h| *h == name);
    let step = column("step").with_context(|| format!("{} has no `step` column", csv.display()))?;
    let columns: Vec<(usize, &str)> = names
        .iter()
        .filter_map(|&n| Some((column(n)?, n)))
        .collect();
    let mut curves: Vec<Curve> = columns
        .iter()
        .map(|&(_, name)| Curve {
            name: name.to_string(),
            points: Vec::new(),
        })
        .collect();
    for (i, line) in lines.enumerate() {
        let cells: Vec<&str> = line.split(',').collect();
        let number = |c: usize| -> anyhow::Result<Option<f64>> {
            match cells.get(c).copied().unwrap_or_default() {
                "" => Ok(None),
                cell => cell.parse().map(Some).with_context(|| {
                    format!("{} line {}: `{cell}` is not a number", csv.display(), i + 2)
                }),
            }
        };
        let Some(x) = number(step)? else { continue };
        for (curve, &(c, _)) in curves.iter_mut().zip(&columns) {
            if let Some(y) = number(c)? {
                curve.points.push((x, y));
            }
        }
    }
    Ok(curves
        .into_iter()
        .filter(|c| !c.points.is_empty())
        .collect())
}

/// Draws each panel, (y axis name, curves against step), one under another, with `title`
/// above them, into the PNG file `out`. Panels without curves are left out.
pub fn draw(panels: &[(&str, Vec<Curve>)], title: &str, out: &Path) -> anyhow::Result<()> {
    static FONT_ONCE: Once = Once::new();
    FONT_ONCE.call_once(|| {
        register_font("sans-serif", FontStyle::Normal, FONT)
            .unwrap_or_else(|_| panic!("the embedded font is a valid TrueType file"));
    });
    let panels: Vec<_> = panels.iter().filter(|(_, c)| !c.is_empty()).collect();
    anyhow::ensure!(!panels.is_empty(), "no loss to plot");
    let root = BitMapBackend::new(out, SIZE).into_drawing_area();
    let err = |e: DrawingAreaErrorKind<_>| anyhow::anyhow!("drawing {}: {e}", out.display());
    root.fill(&WHITE).map_err(err)?;
    let root = root.titled(title, ("sans-serif", 24)).map_err(err)?;
    let x_max = panels
        .iter()
        .flat_map(|(_, curves)| curves.iter().flat_map(|c| &c.points))
        .fold(1f64, |x, p| x.max(p.0));
    for (area, (y_desc, curves)) in root.split_evenly((panels.len(), 1)).iter().zip(panels) {
        draw_panel(area, y_desc, curves, x_max).map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// One panel: `curves` against step on `area`, the y axis named `y_desc`.
fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    y_desc: &str,
    curves: &[Curve],
    x_max: f64,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let points = curves.iter().flat_map(|c| &c.points);
    let (y_min, y_max) = points.fold((f64::MAX, f64::MIN), |(lo, hi), p| {
        (lo.min(p.1), hi.max(p.1))
    });
    let pad = ((y_max - y_min) * 0.05).max(y_max.abs() * 1e-3).max(1e-12);
    let y_label = tick_label((y_min - pad, y_max + pad));
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .margin_right(32)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..x_max, (y_min - pad)..(y_max + pad))?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc(y_desc)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&y_label)
        .label_style(("sans-serif", 16))
        .draw()?;
    for (i, curve) in curves.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                curve.points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(&curve.name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
}

/// The labels of an axis over `range` (about ten ticks): enough digits that neighbouring
/// ticks read apart, in scientific notation where the values are small or large (a
/// fine-tuning rate of 2e-5, tokens per second in the millions), fixed-point otherwise.
fn tick_label((lo, hi): (f64, f64)) -> impl Fn(&f64) -> String {
    let step = ((hi - lo) / 10.0).max(f64::MIN_POSITIVE);
    let magnitude = lo.abs().max(hi.abs()).max(step);
    let scientific = !(1e-2..1e5).contains(&magnitude);
    // Digits after the point: of the mantissa when scientific, of the value otherwise.
    let digits = match scientific {
        true => (magnitude / step).log10().ceil(),
        false => (-step.log10()).ceil(),
    };
    let digits = digits.clamp(0.0, 8.0) as usize;
    move |y: &f64| match scientific {
        true => format!("{y:.digits$e}"),
        false => format!("{y:.digits$}"),
    }
}

/// Writes `loss.png` beside the metrics CSV `csv`, titled with the run's folder name;
/// returns its path.
pub fn plot_run(csv: &Path) -> anyhow::Result<PathBuf> {
    let dir = csv.parent().unwrap_or(Path::new("."));
    let out = dir.join("loss.png");
    let run = dir
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let panels = PANELS
        .iter()
        .map(|&(y_desc, columns)| Ok((y_desc, read_curves(csv, columns)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    anyhow::ensure!(
        !panels[0].1.is_empty(),
        "{} has no `train_loss` or `val_loss` to plot",
        csv.display()
    );
    // Opened first, so that a path that cannot be written says so in plain words (the
    // drawing backend would report it in its own debug form).
    std::fs::File::create(&out).with_context(|| format!("writing {}", out.display()))?;
    draw(&panels, &run, &out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_where_the_plot_goes_is_named_in_plain_words() {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("metrics.csv");
        std::fs::write(
            &csv,
            "step,epoch,train_loss,val_loss\n1,0,2.0,\n2,0,1.5,1.7\n",
        )
        .unwrap();
        std::fs::create_dir(dir.path().join("loss.png")).unwrap();
        let e = format!("{:#}", plot_run(&csv).unwrap_err());
        assert!(e.contains("loss.png") && e.contains("directory"), "{e}");
        assert!(!e.contains("IoError") && !e.contains("Os {"), "{e}");
    }

    /// A small metrics file: a falling train loss every step, validation every 10.
    fn metrics(dir: &Path) -> PathBuf {
        let path = dir.join("metrics.csv");
        let mut text = String::from(
            "step,epoch,train_loss,val_loss,lr,skipped_steps,tokens_per_s,epoch_time_s,comm_wait_s,\
             grad_norm,peak_memory_gib,mfu\n",
        );
        for step in 1..=60 {
            let loss = 1.5 + 4.0 / step as f64;
            let val = if step % 10 == 0 {
                (loss + 0.3).to_string()
            } else {
                String::new()
            };
            let lr = 0.001 * (1.0 - step as f64 / 120.0);
            let norm = 2.0 / step as f64;
            text += &format!("{step},0,{loss},{val},{lr},0,1000.0,0.5,0.0,{norm},0.1,0.5\n");
        }
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn reads_both_curves_by_header_name() {
        let dir = tempfile::tempdir().unwrap();
        let curves = read_curves(&metrics(dir.path()), PANELS[0].1).unwrap();
        assert_eq!(curves.len(), 2);
        assert_eq!(curves[0].points.len(), 60);
        assert_eq!(curves[1].points.len(), 6);
        assert_eq!(curves[1].points[0], (10.0, 1.5 + 0.4 + 0.3));
        let lr = read_curves(&metrics(dir.path()), &["lr", "no_such_column"]).unwrap();
        assert_eq!(
            (lr.len(), lr[0].name.as_str(), lr[0].points.len()),
            (1, "lr", 60)
        );
    }

    #[test]
    fn a_bad_cell_names_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.csv");
        std::fs::write(&path, "step,train_loss,val_loss\n1,2.0,\n2,x,\n").unwrap();
        let e = format!("{:#}", read_curves(&path, &["train_loss"]).unwrap_err());
        assert!(e.contains("line 3") && e.contains("`x`"), "{e}");
    }

    /// At the scales a fine-tuning run's panels have, neighbouring ticks never read alike,
    /// and each label reads back within half a tick of its value.
    #[test]
    fn tick_labels_tell_neighbouring_ticks_apart_at_every_scale() {
        for (lo, hi) in [
            (0.0, 1e-3),      // a fine-tuning learning rate, warmup from 0
            (0.0, 2e-5),      // TRL's full fine-tuning rate
            (1.9e-4, 2e-4),   // a LoRA rate's slow decay
            (2.85, 2.88),     // a real model's loss, barely moving
            (0.1, 50.0),      // gradient norms
            (0.0, 1.5e6),     // tokens per second
            (-3e-3, 2e-3),    // around zero
            (1000.0, 1000.5), // a large value over a small range
        ] {
            let label = tick_label((lo, hi));
            let step = (hi - lo) / 10.0;
            let labels: Vec<String> = (0..=10).map(|i| label(&(lo + step * i as f64))).collect();
            for (i, pair) in labels.windows(2).enumerate() {
                assert_ne!(pair[0], pair[1], "[{lo}, {hi}]: ticks {i} and {}", i + 1);
            }
            for (i, text) in labels.iter().enumerate() {
                let read: f64 = text.parse().unwrap();
                let value = lo + step * i as f64;
                assert!(
                    (read - value).abs() <= step / 2.0,
                    "[{lo}, {hi}]: {text} for {value}"
                );
            }
        }
        // The rates read as rates, not 0.000 or 0.001.
        assert_eq!(tick_label((0.0, 2e-5))(&1.2e-5), "1.2e-5");
    }

    /// The picture is a PNG of the stated size whose caption and labels were drawn: with
    /// no system font involved (plotters is built without font-kit), text pixels can only
    /// come from the embedded font.
    #[test]
    fn writes_a_png_with_text() {
        let dir = tempfile::tempdir().unwrap();
        let out = plot_run(&metrics(dir.path())).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert!(
            (5_000..500_000).contains(&bytes.len()),
            "{} bytes",
            bytes.len()
        );
        let image = image::load_from_memory(&bytes).unwrap().to_rgb8();
        assert_eq!(image.dimensions(), SIZE);
        // The caption band (above the plot's frame) holds dark glyph pixels.
        let dark_in_caption = (0..SIZE.0)
            .flat_map(|x| (0..40).map(move |y| (x, y)))
            .filter(|&(x, y)| image.get_pixel(x, y).0.iter().all(|&c| c < 100))
            .count();
        assert!(
            dark_in_caption > 50,
            "{dark_in_caption} dark pixels in the caption"
        );
    }
}
