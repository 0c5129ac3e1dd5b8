//! The headline ratios as an SVG: two panels of horizontal bars, ours over
//! each peer, with the line at 1 where the two are equal. Left: time or CPU
//! per decision (below 1, ours is cheaper); right: decisions per second
//! (above 1, ours is faster). A bar is blue where ours is ahead, orange
//! where it is behind.
//!
//! Drawn with `plotters`' SVG backend only, as the workspace's other
//! picture (`examples/src/picture.rs`): text is written as SVG `<text>`
//! elements, so no font library is needed.

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::page::{Better, Headline};

/// A bar where ours is ahead of the peer.
pub(crate) const AHEAD: RGBColor = RGBColor(31, 90, 200);
/// A bar where ours is behind the peer.
pub(crate) const BEHIND: RGBColor = RGBColor(230, 140, 40);
/// The line at 1 (equal), dashed.
const EQUAL: RGBColor = RGBColor(90, 90, 90);
/// Dash and gap of the line at 1, in pixels.
const DASH: u32 = 6;
const GAP: u32 = 4;
/// The legend's strip, between the title and the panels.
const LEGEND_HEIGHT: u32 = 34;

/// The legend's entries, in order.
pub(crate) const LEGEND: [&str; 3] = [
    "ours ahead of the peer",
    "ours behind the peer",
    "equal (1.0)",
];

/// Whether ours is ahead at `ratio`.
fn ahead(ratio: f64, better: Better) -> bool {
    match better {
        Better::Lower => ratio < 1.0,
        Better::Higher => ratio > 1.0,
    }
}

/// Draws the legend, one row, centred in `area`.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let (width, height) = area.dim_in_pixel();
    let y = i32::try_from(height / 2).unwrap_or(0);
    let style =
        TextStyle::from(("sans-serif", 15).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    let sample = (3 * DASH + 2 * GAP) as i32;
    let spacing = 36;
    let widths: Vec<i32> = LEGEND
        .iter()
        .map(|text| {
            let (w, _) = area.estimate_text_size(text, &style).unwrap_or((180, 15));
            sample + 8 + i32::try_from(w).unwrap_or(180)
        })
        .collect();
    let total: i32 = widths.iter().sum::<i32>() + spacing * (LEGEND.len() as i32 - 1);
    let mut x = (i32::try_from(width).unwrap_or(0) - total).max(0) / 2;
    for (i, (text, w)) in LEGEND.iter().zip(&widths).enumerate() {
        match i {
            0 | 1 => area.draw(&Rectangle::new(
                [(x, y - 6), (x + sample, y + 6)],
                if i == 0 { AHEAD } else { BEHIND }.filled(),
            )),
            _ => {
                let mut at = x;
                let mut drawn = Ok(());
                while at < x + sample && drawn.is_ok() {
                    let end = (at + DASH as i32).min(x + sample);
                    drawn = area.draw(&PathElement::new(
                        [(at, y), (end, y)],
                        EQUAL.stroke_width(2),
                    ));
                    at += (DASH + GAP) as i32;
                }
                drawn
            }
        }
        .map_err(|e| e.to_string())?;
        area.draw(&Text::new(*text, (x + sample + 8, y), style.clone()))
            .map_err(|e| e.to_string())?;
        x += w + spacing;
    }
    Ok(())
}

/// Draws one panel: a bar per headline, ours over theirs.
fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    caption: &str,
    bars: &[&Headline],
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let values: Vec<f64> = bars.iter().filter_map(|h| h.ratio).collect();
    let top = values.iter().copied().fold(1.0_f64, f64::max);
    let x_max = (top * 1.25).max(1.3);
    let n = bars.len().max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 17))
        .margin(12)
        .margin_right(24)
        .x_label_area_size(40)
        .y_label_area_size(250)
        // `n` segments, the first headline at the top.
        .build_cartesian_2d(0f64..x_max, (0..n - 1).into_segmented())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_labels(6)
        .y_labels(1)
        .x_label_formatter(&|x| format!("{x:.1}"))
        // The names are drawn beside the bars below.
        .y_label_formatter(&|_| String::new())
        .x_desc("ours ÷ theirs")
        .label_style(("sans-serif", 13))
        .light_line_style(BLACK.mix(0.04))
        .draw()
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(DashedLineSeries::new(
            [(1.0, SegmentValue::Exact(0)), (1.0, SegmentValue::Exact(n))],
            DASH,
            GAP,
            EQUAL.stroke_width(2),
        ))
        .map_err(|e| e.to_string())?;
    // The bars' names, right-aligned left of the axis, each level with its
    // bar (drawn on the panel: the label area is outside the chart's own).
    let (base_x, base_y) = area.get_base_pixel();
    let name_style =
        TextStyle::from(("sans-serif", 13).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
    for (k, h) in bars.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(0.0, SegmentValue::CenterOf(n - 1 - k)));
        area.draw(&Text::new(
            h.bar,
            (x - base_x - 8, y - base_y),
            name_style.clone(),
        ))
        .map_err(|e| e.to_string())?;
    }
    for (k, h) in bars.iter().enumerate() {
        let Some(r) = h.ratio else { continue };
        let i = n - 1 - k;
        let colour = if ahead(r, h.better) { AHEAD } else { BEHIND };
        let mut bar = Rectangle::new(
            [
                (0.0, SegmentValue::Exact(i)),
                (r, SegmentValue::Exact(i + 1)),
            ],
            colour.filled(),
        );
        bar.set_margin(6, 6, 0, 0);
        chart
            .draw_series(std::iter::once(bar))
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(std::iter::once(
                EmptyElement::at((r, SegmentValue::CenterOf(i)))
                    + Text::new(
                        format!("{r:.2}"),
                        (6, 0),
                        TextStyle::from(("sans-serif", 13).into_font())
                            .pos(Pos::new(HPos::Left, VPos::Center)),
                    ),
            ))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Renders the headlines as SVG text.
pub(crate) fn headlines_svg(headlines: &[Headline]) -> Result<String, String> {
    let with = |b: Better| -> Vec<&Headline> {
        headlines
            .iter()
            .filter(|h| h.better == b && h.ratio.is_some())
            .collect()
    };
    let (cost, rate) = (with(Better::Lower), with(Better::Higher));
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1200, 460)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let root = root
            .titled(
                "Ours against each peer, measured side by side",
                ("sans-serif", 22),
            )
            .map_err(|e| e.to_string())?;
        let (legend, panels) = root.split_vertically(LEGEND_HEIGHT);
        draw_legend(&legend)?;
        let (left, right) = panels.split_horizontally(600);
        draw_panel(
            &left,
            "time or CPU per decision (below 1: ours is cheaper)",
            &cost,
        )?;
        draw_panel(
            &right,
            "decisions per second (above 1: ours is faster)",
            &rate,
        )?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headline(bar: &'static str, ratio: Option<f64>, better: Better) -> Headline {
        Headline {
            against: "a peer",
            what: "something",
            ours: String::new(),
            theirs: String::new(),
            ratio,
            better,
            bar,
        }
    }

    /// The text of every `<text>` element.
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text ")
            .skip(1)
            .filter_map(|rest| {
                let (_, body) = rest.split_once('>')?;
                Some(body.split("</text>").next()?.trim().to_owned())
            })
            .collect()
    }

    #[test]
    fn a_bar_and_its_value_per_headline_in_its_panel() {
        let svg = headlines_svg(&[
            headline("cheaper peer", Some(1.32), Better::Lower),
            headline("faster peer", Some(2.47), Better::Higher),
            headline("not measured", None, Better::Higher),
        ])
        .unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..60.min(svg.len())]);
        let texts = texts(&svg);
        for t in ["cheaper peer", "faster peer", "1.32", "2.47"] {
            assert!(texts.iter().any(|x| x == t), "no {t:?} in {texts:?}");
        }
        assert!(
            !texts.iter().any(|x| x == "not measured"),
            "a headline without a figure has no bar"
        );
        for entry in LEGEND {
            assert_eq!(texts.iter().filter(|x| *x == entry).count(), 1, "{entry}");
        }
    }

    #[test]
    fn colour_says_who_is_ahead() {
        assert!(ahead(0.5, Better::Lower));
        assert!(!ahead(1.3, Better::Lower));
        assert!(ahead(2.0, Better::Higher));
        assert!(!ahead(0.96, Better::Higher));
    }
}
