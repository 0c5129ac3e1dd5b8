//! The boundary burst as an SVG: for each algorithm, requests sent and
//! requests admitted in the trailing minute around 12:04:00, against the
//! limit. One legend above the panels, outside the data.
//!
//! Drawn with `plotters`' SVG backend only: text is written as SVG `<text>`
//! elements, so no font library is needed to draw it.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use ratelimit_core::Micros;

use crate::accuracy::{self, LIMIT, WINDOW};

/// The limit line's height.
const LIMIT_PER_WINDOW: f64 = LIMIT as f64;
use crate::demo::NOON;

/// 12:04:00, the calendar boundary the burst straddles.
const BOUNDARY: Micros = NOON + 4 * WINDOW;
/// The plotted span around the boundary, in seconds.
const FROM: f64 = -1.5;
const TO: f64 = 1.5;

/// `12:03:59.5` for an offset in seconds from 12:04:00.
fn clock_label(offset: &f64) -> String {
    let tenths = (offset * 10.0).round() as i64 + 4 * 60 * 10;
    let (minutes, rest) = (tenths.div_euclid(600), tenths.rem_euclid(600));
    format!("12:{minutes:02}:{:02}.{}", rest / 10, rest % 10)
}

/// Steps of a count over time: (seconds from the boundary, value) pairs
/// that hold each value until the next change.
fn steps(times: &[Micros], count_at: impl Fn(Micros) -> u64) -> Vec<(f64, f64)> {
    let secs = |t: Micros| (t as f64 - BOUNDARY as f64) / 1e6;
    let start = (BOUNDARY as f64 + FROM * 1e6) as Micros;
    let mut points = vec![(FROM, count_at(start) as f64)];
    for &t in times {
        let x = secs(t);
        if x <= FROM || x >= TO {
            continue;
        }
        let before = points.last().map_or(0.0, |p| p.1);
        points.push((x, before));
        points.push((x, count_at(t) as f64));
    }
    let last = points.last().map_or(0.0, |p| p.1);
    points.push((TO, last));
    points
}

/// The sent line: a wide, light band under the admitted line, so that
/// where the two coincide (the fixed window admits everything sent) both
/// stay visible.
const SENT: RGBColor = RGBColor(196, 196, 196);
const SENT_WIDTH: u32 = 8;
/// The admitted line, drawn over the sent band.
const ADMITTED: RGBColor = RGBColor(31, 90, 200);
const ADMITTED_WIDTH: u32 = 2;
/// The limit, dashed, drawn last: where the admitted line runs along it
/// (the sliding log at 100), the dashes show over it.
const LIMIT_COLOR: RGBColor = RGBColor(220, 30, 30);
const LIMIT_WIDTH: u32 = 2;
/// Dash and gap of the limit line, in pixels: the same in the plot and in
/// the legend.
const DASH: u32 = 8;
const GAP: u32 = 5;
/// The legend's strip, between the title and the panels.
const LEGEND_HEIGHT: u32 = 34;

/// The legend's entries, in order.
pub const LEGEND: [&str; 3] = [
    "sent since 12:03:59",
    "admitted in the trailing 60 s",
    "limit: 100 in any trailing 60 s",
];

/// What each panel's caption says: the algorithm and what it admitted; for
/// the token bucket, sold as "100 per minute, burst 20", its pace too (20 at
/// once, then one token every 0.6 s: one by 12:04:00, when the burst stops).
fn caption(quota: &ratelimit_core::Quota, admitted: usize, peak: u64) -> String {
    match quota.kind() {
        ratelimit_core::AlgorithmKind::TokenBucket => {
            format!("token bucket (burst 20, then 1 per 0.6 s): {admitted} admitted")
        }
        _ => format!(
            "{}: {admitted} admitted, at most {peak} in a trailing minute",
            accuracy::label(quota)
        ),
    }
}

/// Draws the legend, one row, centred in `area`: each entry's sample drawn
/// as in the plot (the limit dashed), then its text.
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
    // Three dashes of the limit line exactly, and the other samples as long.
    let sample = (3 * DASH + 2 * GAP) as i32;
    let spacing = 36;
    let widths: Vec<i32> = LEGEND
        .iter()
        .map(|text| {
            let (w, _) = area.estimate_text_size(text, &style).unwrap_or((200, 15));
            sample + 8 + i32::try_from(w).unwrap_or(200)
        })
        .collect();
    let total: i32 = widths.iter().sum::<i32>() + spacing * (LEGEND.len() as i32 - 1);
    let mut x = (i32::try_from(width).unwrap_or(0) - total).max(0) / 2;
    for (i, (text, w)) in LEGEND.iter().zip(&widths).enumerate() {
        match i {
            0 => area.draw(&PathElement::new(
                [(x, y), (x + sample, y)],
                SENT.stroke_width(SENT_WIDTH),
            )),
            1 => area.draw(&PathElement::new(
                [(x, y), (x + sample, y)],
                ADMITTED.stroke_width(ADMITTED_WIDTH),
            )),
            _ => {
                let mut at = x;
                let mut drawn = Ok(());
                while at < x + sample && drawn.is_ok() {
                    let end = (at + DASH as i32).min(x + sample);
                    drawn = area.draw(&PathElement::new(
                        [(at, y), (end, y)],
                        LIMIT_COLOR.stroke_width(LIMIT_WIDTH),
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

/// Renders the picture as SVG text.
///
/// Above the four panels, one legend for all of them (outside the data);
/// in each panel the requests sent since 12:03:59 as a wide light band, the
/// requests admitted in the trailing 60 s as a blue line over it, and the
/// limit of 100 dashed over both.
pub fn boundary_burst_svg() -> Result<String, String> {
    let runs = accuracy::boundary_burst();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1100, 800)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let root = root
            .titled(
                "Boundary burst, plan 100 per minute: 100 requests at 12:03:59.0-.1, 100 at 12:04:00.0-.1",
                ("sans-serif", 22),
            )
            .map_err(|e| e.to_string())?;
        let (legend, panels) = root.split_vertically(LEGEND_HEIGHT);
        draw_legend(&legend)?;
        for (panel, (quota, arrivals, decisions)) in panels.split_evenly((2, 2)).iter().zip(&runs) {
            let sent_times: Vec<Micros> = arrivals.iter().map(|a| a.at).collect();
            let admitted: Vec<Micros> = arrivals
                .iter()
                .zip(decisions)
                .filter(|(_, ok)| **ok)
                .map(|(a, _)| a.at)
                .collect();
            let trailing = |t: Micros| {
                let hi = admitted.partition_point(|&x| x <= t);
                let lo = admitted.partition_point(|&x| x + WINDOW <= t);
                (hi - lo) as u64
            };
            let sent = |t: Micros| sent_times.partition_point(|&x| x <= t) as u64;
            let peak = crate::demo::max_in_trailing(&admitted, WINDOW).0;
            let mut chart = ChartBuilder::on(panel)
                .caption(caption(quota, admitted.len(), peak), ("sans-serif", 17))
                .margin(12)
                .margin_right(44)
                .x_label_area_size(40)
                .y_label_area_size(48)
                .build_cartesian_2d(FROM..TO, 0f64..220f64)
                .map_err(|e| e.to_string())?;
            chart
                .configure_mesh()
                .x_labels(7)
                .y_labels(12)
                .x_label_formatter(&clock_label)
                .y_label_formatter(&|y| format!("{y:.0}"))
                .x_desc("time (UTC)")
                .y_desc("requests")
                .label_style(("sans-serif", 13))
                .light_line_style(BLACK.mix(0.04))
                .draw()
                .map_err(|e| e.to_string())?;
            chart
                .draw_series(std::iter::once(PathElement::new(
                    [(0.0, 0.0), (0.0, 220.0)],
                    BLACK.mix(0.35).stroke_width(1),
                )))
                .map_err(|e| e.to_string())?;
            chart
                .draw_series(LineSeries::new(
                    steps(&sent_times, sent),
                    SENT.stroke_width(SENT_WIDTH),
                ))
                .map_err(|e| e.to_string())?;
            chart
                .draw_series(LineSeries::new(
                    steps(&admitted, trailing),
                    ADMITTED.stroke_width(ADMITTED_WIDTH),
                ))
                .map_err(|e| e.to_string())?;
            chart
                .draw_series(DashedLineSeries::new(
                    [(FROM, LIMIT_PER_WINDOW), (TO, LIMIT_PER_WINDOW)],
                    DASH,
                    GAP,
                    LIMIT_COLOR.stroke_width(LIMIT_WIDTH),
                ))
                .map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_labels() {
        assert_eq!(clock_label(&0.0), "12:04:00.0");
        assert_eq!(clock_label(&-0.5), "12:03:59.5");
        assert_eq!(clock_label(&1.25), "12:04:01.3");
    }

    /// An attribute's value in one SVG tag.
    fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
        let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
        let len = tag[start..].find('"')?;
        Some(&tag[start..start + len])
    }

    /// `(y, text)` of every `<text>` element.
    fn texts(svg: &str) -> Vec<(f64, String)> {
        svg.split("<text ")
            .skip(1)
            .map(|rest| {
                let (tag, body) = rest.split_once('>').unwrap();
                let text = body.split("</text>").next().unwrap().trim().to_owned();
                (attr(tag, "y").unwrap().parse().unwrap(), text)
            })
            .collect()
    }

    /// A polyline: stroke colour, stroke width, points.
    type Line = (String, u32, Vec<(f64, f64)>);

    /// Every polyline, in drawing order.
    fn polylines(svg: &str) -> Vec<Line> {
        svg.split("<polyline ")
            .skip(1)
            .map(|rest| {
                let tag = rest.split("/>").next().unwrap();
                let points = attr(tag, "points")
                    .unwrap()
                    .split_whitespace()
                    .map(|p| {
                        let (x, y) = p.split_once(',').unwrap();
                        (x.parse().unwrap(), y.parse().unwrap())
                    })
                    .collect();
                (
                    attr(tag, "stroke").unwrap_or("").to_owned(),
                    attr(tag, "stroke-width").unwrap_or("1").parse().unwrap(),
                    points,
                )
            })
            .collect()
    }

    fn hex(c: RGBColor) -> String {
        format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
    }

    /// The top of the panels: the highest panel caption.
    fn panels_top(svg: &str) -> f64 {
        let captions: Vec<f64> = texts(svg)
            .into_iter()
            .filter(|(_, t)| t.contains(" admitted"))
            .map(|(y, _)| y)
            .collect();
        assert_eq!(captions.len(), 4, "one caption per panel");
        captions.into_iter().fold(f64::INFINITY, f64::min)
    }

    #[test]
    fn one_legend_outside_the_panels() {
        let svg = boundary_burst_svg().unwrap();
        let top = panels_top(&svg);
        let texts = texts(&svg);
        for entry in LEGEND {
            let at: Vec<f64> = texts
                .iter()
                .filter(|(_, t)| t == entry)
                .map(|(y, _)| *y)
                .collect();
            assert_eq!(at.len(), 1, "{entry:?} once, for every panel: {at:?}");
            assert!(
                at[0] < top,
                "{entry:?} at y {} is not above the panels ({top})",
                at[0]
            );
        }
        // Nothing of the legend's samples is drawn inside a panel either:
        // every line above the panels is a legend sample.
        let samples = polylines(&svg)
            .into_iter()
            .filter(|(_, _, p)| p.iter().all(|&(_, y)| y < top))
            .count();
        assert!(samples >= 3, "{samples} legend samples above the panels");
    }

    #[test]
    fn the_limit_is_dashed_in_the_legend_as_in_the_plot() {
        let svg = boundary_burst_svg().unwrap();
        let top = panels_top(&svg);
        let limit: Vec<_> = polylines(&svg)
            .into_iter()
            .filter(|(c, _, _)| *c == hex(LIMIT_COLOR))
            .collect();
        let (legend, plot): (Vec<_>, Vec<_>) = limit
            .iter()
            .partition(|(_, _, p)| p.iter().all(|&(_, y)| y < top));
        let dash = |(_, _, p): &&Line| {
            let len = (p[p.len() - 1].0 - p[0].0).abs();
            len > 0.0 && len <= f64::from(DASH)
        };
        assert!(
            legend.len() >= 3,
            "the legend's limit sample is {} segment(s)",
            legend.len()
        );
        assert!(
            legend.iter().all(dash),
            "the legend's limit sample is not dashed"
        );
        assert!(
            plot.len() > 4 * 10,
            "the limit line is dashed in every panel"
        );
        assert!(plot.iter().all(dash), "the plot's limit line is not dashed");
    }

    #[test]
    fn the_sent_line_stays_visible_under_the_admitted_one() {
        let svg = boundary_burst_svg().unwrap();
        let top = panels_top(&svg);
        let lines: Vec<_> = polylines(&svg)
            .into_iter()
            .filter(|(_, _, p)| p.iter().any(|&(_, y)| y > top))
            .collect();
        let sent: Vec<usize> = (0..lines.len())
            .filter(|&i| lines[i].0 == hex(SENT))
            .collect();
        let admitted: Vec<usize> = (0..lines.len())
            .filter(|&i| lines[i].0 == hex(ADMITTED))
            .collect();
        assert_eq!(
            (sent.len(), admitted.len()),
            (4, 4),
            "one of each per panel"
        );
        for (&s, &a) in sent.iter().zip(&admitted) {
            // Drawn first and wider: where the two coincide (the fixed
            // window admits all it is sent) the band shows either side.
            assert!(s < a, "the sent line is drawn over the admitted one");
            assert!(
                lines[s].1 >= lines[a].1 + 4,
                "the sent line ({} px) is not wider than the admitted one ({} px)",
                lines[s].1,
                lines[a].1
            );
        }
    }
}
