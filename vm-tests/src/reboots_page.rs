//! Reads the operator dashboard's Reboots page (`/reboots`, as served) back: which devices its recent releases are
//! shown as, and the hold chart's bars, so the demo and the TaskRun test check what a person sees after reboots
//! through FleetLock: each hold as the device it is, and bars that can be seen.

/// Least width of a bar, in the chart's user units (a hundredth of its width): below it a hold is a sliver.
pub const READABLE_BAR: u64 = 10;

/// The `data-device` of every `released` row of the recent events table, newest first (`""` for a row the page
/// shows as an unknown holder).
pub fn released_as(page: &str) -> Vec<String> {
    page.split("<tr>")
        .filter(|row| row.contains("data-event=\"released\""))
        .filter_map(|row| attr(row, "data-device"))
        .collect()
}

/// The chart's width (its `viewBox`) and the `(x, width)` of every hold's bar, newest first.
pub fn bars(page: &str) -> (u64, Vec<(u64, u64)>) {
    let width = page
        .split("viewBox=\"0 0 ")
        .nth(1)
        .and_then(|v| v.split(' ').next()?.parse().ok())
        .unwrap_or(0);
    let bars = page
        .split("<rect data-bar=\"hold\"")
        .skip(1)
        .filter_map(|r| {
            let n = |a| attr(r, a)?.parse::<u64>().ok();
            Some((n("x")?, n("width")?))
        })
        .collect();
    (width, bars)
}

/// What is wrong with `page` after each of `devices` rebooted once through FleetLock and gave its slot back:
/// every one shown by its id in a release, no release by an unknown holder, every bar at least
/// [`READABLE_BAR`] wide and the latest reaching the chart's right end (the axis spans the holds, not the time
/// since). `Ok` with a one-line summary.
pub fn check_released(page: &str, devices: &[&str]) -> Result<String, String> {
    let shown = released_as(page);
    for d in devices {
        if !shown.iter().any(|s| s == d) {
            return Err(format!(
                "no release shown as {d}; releases shown as {shown:?}"
            ));
        }
    }
    if shown.iter().any(String::is_empty) {
        return Err(format!("a release by an unknown holder: {shown:?}"));
    }
    let (width, bars) = bars(page);
    if bars.len() < devices.len() {
        return Err(format!("{} bars for {} holds", bars.len(), devices.len()));
    }
    if let Some((x, w)) = bars.iter().find(|(_, w)| *w < READABLE_BAR) {
        return Err(format!("a bar of {w} units at {x}: {bars:?}"));
    }
    let right = bars.iter().map(|(x, w)| x + w).max().unwrap_or(0);
    if right * 100 < width * 95 {
        return Err(format!(
            "the latest hold ends at {right} of {width}: the axis runs past the holds ({bars:?})"
        ));
    }
    let widths: Vec<String> = bars.iter().map(|(_, w)| w.to_string()).collect();
    Ok(format!(
        "releases shown as {}; bars {} of {width} units wide",
        shown.join(", "),
        widths.join(", ")
    ))
}

/// The value of attribute `name` in the first tag of `html` that has it.
fn attr(html: &str, name: &str) -> Option<String> {
    let v = html.split(&format!(" {name}=\"")).nth(1)?;
    Some(v.split('"').next()?.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"<svg viewBox="0 0 1000 80"><g data-hold="default/a"><rect data-bar="hold" x="500" y="4" width="490" height="10"></rect></g><g><rect data-bar="hold" x="10" y="34" width="12" height="10"></rect></g></svg>
<table><tr><td>t</td><td><span data-event="granted">granted</span></td><td><span data-holder="h1" data-device="demo-2"></span></td></tr><tr><td>t</td><td><span data-event="released">released</span></td><td><span data-holder="h1" data-device="demo-2"><a>demo-2</a></span></td></tr><tr><td>t</td><td><span data-event="released">released</span></td><td><span data-holder="h0" data-device="demo-1"></span></td></tr></table>"#;

    #[test]
    fn a_page_is_read_back() {
        assert_eq!(released_as(PAGE), ["demo-2", "demo-1"]);
        assert_eq!(bars(PAGE), (1000, vec![(500, 490), (10, 12)]));
        assert!(check_released(PAGE, &["demo-1", "demo-2"]).is_ok());
        assert!(check_released(PAGE, &["demo-3"]).is_err());
        let sliver = PAGE.replace("width=\"12\"", "width=\"1\"");
        assert!(check_released(&sliver, &["demo-1"]).is_err());
        let to_now = PAGE.replace("width=\"490\"", "width=\"200\"");
        assert!(check_released(&to_now, &["demo-1"]).is_err());
        let unknown = PAGE.replace("data-device=\"demo-1\"", "data-device=\"\"");
        assert!(check_released(&unknown, &["demo-2"]).is_err());
    }
}
