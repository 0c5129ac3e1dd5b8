//! The boundary burst as an SVG: for each algorithm, requests sent and
//! requests admitted in the trailing minute around 12:04:00, against the
//! limit.
//!
//! Drawn with `plotters`' SVG backend only: text is written as SVG `<text>`
//! elements, so no font library is needed to draw it.

use plotters::prelude::*;
use ratelimit_core::Micros;

use crate::accuracy::{self, LIMIT, WINDOW};
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

/// Renders the picture as SVG text.
pub fn boundary_burst_svg() -> Result<String, String> {
    let runs = accuracy::boundary_burst();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1100, 760)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let root = root
            .titled(
                "Boundary burst, plan 100 per minute: 100 requests at 12:03:59.0-.1, 100 at 12:04:00.0-.1",
                ("sans-serif", 22),
            )
            .map_err(|e| e.to_string())?;
        for (panel, (quota, arrivals, decisions)) in root.split_evenly((2, 2)).iter().zip(&runs) {
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
            let caption = format!(
                "{}: {} admitted, at most {} in a trailing minute",
                accuracy::label(quota),
                admitted.len(),
                peak
            );
            let mut chart = ChartBuilder::on(panel)
                .caption(caption, ("sans-serif", 17))
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
                .draw()
                .map_err(|e| e.to_string())?;
            let grey = RGBColor(150, 150, 150);
            let blue = RGBColor(31, 90, 200);
            chart
                .draw_series(LineSeries::new(
                    steps(&sent_times, sent),
                    grey.stroke_width(2),
                ))
                .map_err(|e| e.to_string())?
                .label("sent since 12:03:59")
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], grey.stroke_width(2))
                });
            chart
                .draw_series(LineSeries::new(
                    steps(&admitted, trailing),
                    blue.stroke_width(3),
                ))
                .map_err(|e| e.to_string())?
                .label("admitted in the trailing 60 s")
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], blue.stroke_width(3))
                });
            chart
                .draw_series(DashedLineSeries::new(
                    [(FROM, LIMIT as f64), (TO, LIMIT as f64)],
                    8,
                    5,
                    RED.stroke_width(2),
                ))
                .map_err(|e| e.to_string())?
                .label("limit: 100 in any trailing 60 s")
                .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED.stroke_width(2)));
            chart
                .draw_series(std::iter::once(PathElement::new(
                    [(0.0, 0.0), (0.0, 220.0)],
                    BLACK.mix(0.35).stroke_width(1),
                )))
                .map_err(|e| e.to_string())?;
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .label_font(("sans-serif", 13))
                .background_style(WHITE.mix(0.9))
                .border_style(BLACK.mix(0.4))
                .draw()
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
}
