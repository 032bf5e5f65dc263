//! `loss.png` beside a run's metrics CSV: train and validation loss against step, drawn with
//! plotters. The font ships inside the binary (DejaVu Sans, `assets/fonts`), so the
//! picture needs no system fonts.

use anyhow::Context;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};
use std::path::{Path, PathBuf};
use std::sync::Once;

/// The embedded font, registered as plotters' "sans-serif" (the family its labels ask for).
const FONT: &[u8] = include_bytes!("../assets/fonts/DejaVuSans.ttf");

/// Width and height of the picture in pixels.
const SIZE: (u32, u32) = (900, 540);

/// One named line: (step, loss) points.
#[derive(Debug)]
pub struct Curve {
    /// The legend entry.
    pub name: String,
    /// (step, loss), in step order.
    pub points: Vec<(f64, f64)>,
}

/// The train and validation curves of a metrics CSV (columns found by their header names;
/// steps without validation have an empty `val_loss`).
pub fn read_losses(csv: &Path) -> anyhow::Result<Vec<Curve>> {
    let text =
        std::fs::read_to_string(csv).with_context(|| format!("reading {}", csv.display()))?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let column = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .with_context(|| format!("{} has no `{name}` column", csv.display()))
    };
    let (step, train, val) = (column("step")?, column("train_loss")?, column("val_loss")?);
    let mut curves = ["train_loss", "val_loss"].map(|name| Curve {
        name: name.to_string(),
        points: Vec::new(),
    });
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
        for (curve, c) in curves.iter_mut().zip([train, val]) {
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

/// Draws `curves` (loss against step) with `title` into the PNG file `out`.
pub fn draw(curves: &[Curve], title: &str, out: &Path) -> anyhow::Result<()> {
    static FONT_ONCE: Once = Once::new();
    FONT_ONCE.call_once(|| {
        register_font("sans-serif", FontStyle::Normal, FONT)
            .unwrap_or_else(|_| panic!("the embedded font is a valid TrueType file"));
    });
    let points = curves.iter().flat_map(|c| &c.points);
    let (x_max, y_min, y_max) = points.fold((1f64, f64::MAX, f64::MIN), |(x, lo, hi), p| {
        (x.max(p.0), lo.min(p.1), hi.max(p.1))
    });
    anyhow::ensure!(y_min <= y_max, "no loss to plot");
    let pad = ((y_max - y_min) * 0.05).max(1e-3);

    let root = BitMapBackend::new(out, SIZE).into_drawing_area();
    let err = |e: DrawingAreaErrorKind<_>| anyhow::anyhow!("drawing {}: {e}", out.display());
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(16)
        .margin_right(32)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..x_max, (y_min - pad)..(y_max + pad))
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("loss")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.2}"))
        .label_style(("sans-serif", 16))
        .draw()
        .map_err(err)?;
    for (i, curve) in curves.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                curve.points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(&curve.name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
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
    let curves = read_losses(csv)?;
    // Opened first, so that a path that cannot be written says so in plain words (the
    // drawing backend would report it in its own debug form).
    std::fs::File::create(&out).with_context(|| format!("writing {}", out.display()))?;
    draw(&curves, &format!("{run}: loss"), &out)?;
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
            "step,epoch,train_loss,val_loss,lr,skipped_steps,tokens_per_s,epoch_time_s,comm_wait_s\n",
        );
        for step in 1..=60 {
            let loss = 1.5 + 4.0 / step as f64;
            let val = if step % 10 == 0 {
                (loss + 0.3).to_string()
            } else {
                String::new()
            };
            text += &format!("{step},0,{loss},{val},0.001,0,1000.0,0.5,0.0\n");
        }
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn reads_both_curves_by_header_name() {
        let dir = tempfile::tempdir().unwrap();
        let curves = read_losses(&metrics(dir.path())).unwrap();
        assert_eq!(curves.len(), 2);
        assert_eq!(curves[0].points.len(), 60);
        assert_eq!(curves[1].points.len(), 6);
        assert_eq!(curves[1].points[0], (10.0, 1.5 + 0.4 + 0.3));
    }

    #[test]
    fn a_bad_cell_names_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.csv");
        std::fs::write(&path, "step,train_loss,val_loss\n1,2.0,\n2,x,\n").unwrap();
        let e = format!("{:#}", read_losses(&path).unwrap_err());
        assert!(e.contains("line 3") && e.contains("`x`"), "{e}");
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
