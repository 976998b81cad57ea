//! Window tables: edges, crossing midnight, the clock changes of Europe/Berlin in 2026, work longer than a
//! window, openings days ahead, bad input, the wire form, and the old reboot check as a property.

use super::*;
use proptest::prelude::*;

/// A zone read from the system tzdb (the same files [`Window::resolve`] reads), without the `os` feature.
fn zone(name: &str) -> TimeZone {
    let dir = std::env::var_os("TZDIR").unwrap_or_else(|| "/usr/share/zoneinfo".into());
    let path = std::path::Path::new(&dir).join(name);
    let data = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (the window tests need tzdata)", path.display()));
    TimeZone::tzif(name, &data).expect("tzif")
}

fn w(tz: &str, days: &[&str], start: &str, end: &str) -> Window {
    let spec = WindowSpec::parse(days, start, end, tz).expect("window");
    Window::with_zone(spec, zone(tz))
}

fn at(s: &str) -> Timestamp {
    s.parse().expect("timestamp")
}

/// What a row expects at an instant (UTC, RFC 3339).
#[derive(Debug)]
enum Is {
    /// Inside; closes then.
    Open(&'static str),
    /// Outside; opens then.
    Closed(&'static str),
}

fn table(win: &Window, rows: &[(&str, Is)]) {
    for (now, expect) in rows {
        let want = match expect {
            Is::Open(c) => WindowState::Open { closes: at(c) },
            Is::Closed(o) => WindowState::Closed { opens: Some(at(o)) },
        };
        let got = win.state(at(now));
        assert_eq!(
            got,
            want,
            "{} at {now} ({}): {}",
            win.spec(),
            win.local_text(at(now)),
            win.describe(at(now))
        );
        assert_eq!(win.contains(at(now)), matches!(expect, Is::Open(_)));
    }
}

#[test]
fn simple_window_edges() {
    let win = w("UTC", &[], "02:00", "05:00");
    table(
        &win,
        &[
            ("2026-11-30T01:59:59Z", Is::Closed("2026-11-30T02:00:00Z")),
            ("2026-11-30T02:00:00Z", Is::Open("2026-11-30T05:00:00Z")),
            ("2026-11-30T04:59:59.999Z", Is::Open("2026-11-30T05:00:00Z")),
            ("2026-11-30T05:00:00Z", Is::Closed("2026-12-01T02:00:00Z")),
        ],
    );
}

#[test]
fn crossing_midnight_belongs_to_the_day_it_starts_on() {
    // Friday 22:00 to Saturday 04:00 in Berlin (CET, UTC+1, in December). 2026-12-04 is a Friday.
    let win = w("Europe/Berlin", &["fri"], "22:00", "04:00");
    table(
        &win,
        &[
            // Friday early morning: that would be Thursday's window, and Thursday is not listed.
            ("2026-12-04T00:30:00Z", Is::Closed("2026-12-04T21:00:00Z")),
            ("2026-12-04T20:59:00Z", Is::Closed("2026-12-04T21:00:00Z")),
            ("2026-12-04T21:00:00Z", Is::Open("2026-12-05T03:00:00Z")), // Fri 22:00
            ("2026-12-04T23:30:00Z", Is::Open("2026-12-05T03:00:00Z")), // Sat 00:30
            ("2026-12-05T02:59:00Z", Is::Open("2026-12-05T03:00:00Z")), // Sat 03:59
            ("2026-12-05T03:00:00Z", Is::Closed("2026-12-11T21:00:00Z")), // Sat 04:00
            ("2026-12-05T21:30:00Z", Is::Closed("2026-12-11T21:00:00Z")), // Sat 22:30: not listed
        ],
    );
    // Listed on Thursday too: Friday's early hours are Thursday's window.
    let win = w("Europe/Berlin", &["thu", "fri"], "22:00", "04:00");
    table(
        &win,
        &[("2026-12-04T00:30:00Z", Is::Open("2026-12-04T03:00:00Z"))],
    );
    // Every day, 23:00-00:00: ends at midnight, written 00:00.
    let win = w("UTC", &[], "23:00", "00:00");
    table(
        &win,
        &[
            ("2026-12-04T23:59:59Z", Is::Open("2026-12-05T00:00:00Z")),
            ("2026-12-05T00:00:00Z", Is::Closed("2026-12-05T23:00:00Z")),
        ],
    );
}

#[test]
fn spring_forward_in_berlin() {
    // 2026-03-29 (a Sunday): at 01:00 UTC the clock jumps from 02:00 CET to 03:00 CEST; 02:00-02:59 never happens.
    // A window wholly in the skipped hour does not open that night; the next listed day's window is the next.
    let win = w("Europe/Berlin", &["sun"], "02:00", "03:00");
    table(
        &win,
        &[
            ("2026-03-29T00:30:00Z", Is::Closed("2026-04-05T00:00:00Z")), // 01:30 CET
            ("2026-03-29T01:00:00Z", Is::Closed("2026-04-05T00:00:00Z")), // 03:00 CEST
            ("2026-04-05T00:00:00Z", Is::Open("2026-04-05T01:00:00Z")),   // next Sunday, CEST
        ],
    );
    let daily = w("Europe/Berlin", &[], "02:00", "03:00");
    table(
        &daily,
        &[
            ("2026-03-28T01:30:00Z", Is::Open("2026-03-28T02:00:00Z")), // Saturday 02:30 CET
            ("2026-03-28T02:00:00Z", Is::Closed("2026-03-30T00:00:00Z")), // skips Sunday
        ],
    );
    // A window that starts in the skipped hour opens when the clock jumps; it is an hour shorter that night.
    let win = w("Europe/Berlin", &["sun"], "02:00", "05:00");
    table(
        &win,
        &[
            ("2026-03-29T00:59:00Z", Is::Closed("2026-03-29T01:00:00Z")), // 01:59 CET
            ("2026-03-29T01:00:00Z", Is::Open("2026-03-29T03:00:00Z")),   // 03:00 CEST, open 2 h
            ("2026-03-29T03:00:00Z", Is::Closed("2026-04-05T00:00:00Z")), // 05:00 CEST
        ],
    );
    let win = w("Europe/Berlin", &["sun"], "02:30", "04:00");
    table(
        &win,
        &[("2026-03-29T00:59:00Z", Is::Closed("2026-03-29T01:00:00Z"))],
    );
    // One that ends in the skipped hour closes when the clock jumps.
    let win = w("Europe/Berlin", &["sun"], "01:00", "02:30");
    table(
        &win,
        &[
            ("2026-03-29T00:00:00Z", Is::Open("2026-03-29T01:00:00Z")), // 01:00 CET
            ("2026-03-29T01:00:00Z", Is::Closed("2026-04-04T23:00:00Z")),
        ],
    );
    // Across midnight and the change: Saturday 22:00 CET to Sunday 04:00 CEST, five hours.
    let win = w("Europe/Berlin", &["sat"], "22:00", "04:00");
    table(
        &win,
        &[
            ("2026-03-28T21:00:00Z", Is::Open("2026-03-29T02:00:00Z")),
            ("2026-03-29T01:30:00Z", Is::Open("2026-03-29T02:00:00Z")), // 03:30 CEST
            ("2026-03-29T02:00:00Z", Is::Closed("2026-04-04T20:00:00Z")), // next Sat 22:00 CEST
        ],
    );
}

#[test]
fn fall_back_in_berlin() {
    // 2026-10-25 (a Sunday): at 01:00 UTC the clock goes back from 03:00 CEST to 02:00 CET; 02:00-02:59 happens
    // twice (00:00-01:00 UTC in CEST, 01:00-02:00 UTC in CET).
    // A window wholly in the repeated hour is open through both: two hours.
    let win = w("Europe/Berlin", &["sun"], "02:00", "03:00");
    table(
        &win,
        &[
            ("2026-10-24T23:59:00Z", Is::Closed("2026-10-25T00:00:00Z")), // 01:59 CEST
            ("2026-10-25T00:00:00Z", Is::Open("2026-10-25T02:00:00Z")),   // 02:00 CEST
            ("2026-10-25T01:30:00Z", Is::Open("2026-10-25T02:00:00Z")),   // 02:30 CET
            ("2026-10-25T02:00:00Z", Is::Closed("2026-11-01T01:00:00Z")), // 03:00 CET
        ],
    );
    // A window across the repeated hour: 01:00 CEST to 04:00 CET, four hours.
    let win = w("Europe/Berlin", &["sun"], "01:00", "04:00");
    table(
        &win,
        &[
            ("2026-10-24T23:00:00Z", Is::Open("2026-10-25T03:00:00Z")),
            ("2026-10-25T01:00:00Z", Is::Open("2026-10-25T03:00:00Z")), // 02:00 CET (again)
            ("2026-10-25T03:00:00Z", Is::Closed("2026-11-01T00:00:00Z")),
        ],
    );
    // Starting in the repeated hour: opens at the first 02:30 and stays open when the clock shows 02:00 again.
    let win = w("Europe/Berlin", &["sun"], "02:30", "05:00");
    table(
        &win,
        &[
            ("2026-10-25T00:29:00Z", Is::Closed("2026-10-25T00:30:00Z")),
            ("2026-10-25T00:30:00Z", Is::Open("2026-10-25T04:00:00Z")), // 02:30 CEST
            ("2026-10-25T01:15:00Z", Is::Open("2026-10-25T04:00:00Z")), // 02:15 CET
        ],
    );
    // Ending in the repeated hour: closes at the first 02:30 and does not open again at the second.
    let win = w("Europe/Berlin", &["sun"], "01:00", "02:30");
    table(
        &win,
        &[
            ("2026-10-25T00:15:00Z", Is::Open("2026-10-25T00:30:00Z")), // 02:15 CEST
            ("2026-10-25T01:15:00Z", Is::Closed("2026-11-01T00:00:00Z")), // 02:15 CET
        ],
    );
    // Across midnight and the change: Saturday 22:00 CEST to Sunday 04:00 CET, seven hours.
    let win = w("Europe/Berlin", &["sat"], "22:00", "04:00");
    table(
        &win,
        &[
            ("2026-10-24T20:00:00Z", Is::Open("2026-10-25T03:00:00Z")),
            ("2026-10-25T02:30:00Z", Is::Open("2026-10-25T03:00:00Z")), // 03:30 CET
            ("2026-10-25T03:00:00Z", Is::Closed("2026-10-31T21:00:00Z")), // next Sat 22:00 CET
        ],
    );
}

#[test]
fn the_reboot_clients_vienna_rows_still_hold() {
    // The rows of the reboot client's own test before the window moved here.
    let win = w("Europe/Vienna", &["sun"], "02:00", "05:00");
    for (now, inside) in [
        ("2026-03-29T00:59:00Z", false),
        ("2026-03-29T01:00:00Z", true),
        ("2026-03-29T02:59:00Z", true),
        ("2026-03-29T03:00:00Z", false),
        ("2026-10-25T00:30:00Z", true),
        ("2026-10-25T01:30:00Z", true),
        ("2026-10-25T03:59:00Z", true),
        ("2026-10-25T04:00:00Z", false),
        ("2026-07-05T00:00:00Z", true),
        ("2026-07-05T03:00:00Z", false),
    ] {
        assert_eq!(win.contains(at(now)), inside, "{now}");
    }
}

#[test]
fn a_window_shorter_than_the_work_only_gates_its_start() {
    // 02:00-02:10 UTC, and a download that takes 17 minutes (100 MB over LTE Cat-M1). The type answers times
    // only; the callers' rule (module docs) is that work started inside the window finishes after it closes.
    let win = w("UTC", &[], "02:00", "02:10");
    let started = at("2026-12-07T02:05:00Z");
    let finished = started.plus(std::time::Duration::from_secs(17 * 60));
    assert_eq!(
        win.state(started),
        WindowState::Open {
            closes: at("2026-12-07T02:10:00Z")
        }
    );
    // A caller that knows the length may see that 5 minutes are left ...
    assert_eq!(
        win.closes(started).map(|c| c.since(started)),
        Some(std::time::Duration::from_secs(300))
    );
    // ... and the window is closed when the work ends; nothing new would start then.
    assert!(!win.contains(finished));
    assert_eq!(win.next_open(finished), Some(at("2026-12-08T02:00:00Z")));
}

#[test]
fn next_open_across_days_that_do_not_match() {
    // Mondays only, 09:00-17:00 Berlin. 2026-12-01 is a Tuesday.
    let win = w("Europe/Berlin", &["mon"], "09:00", "17:00");
    table(
        &win,
        &[
            ("2026-12-01T09:00:00Z", Is::Closed("2026-12-07T08:00:00Z")), // six days ahead
            ("2026-12-06T22:59:00Z", Is::Closed("2026-12-07T08:00:00Z")), // Sun 23:59
            ("2026-12-07T16:00:00Z", Is::Closed("2026-12-14T08:00:00Z")), // Mon 17:00: a week
        ],
    );
    // Inside a window, the next opening is the next period's.
    assert_eq!(
        win.next_open(at("2026-12-07T10:00:00Z")),
        Some(at("2026-12-14T08:00:00Z"))
    );
    // Across the spring change, from a Tuesday: Sunday's window is skipped, the one a week later is next.
    let win = w("Europe/Berlin", &["sun"], "02:00", "03:00");
    assert_eq!(
        win.next_open(at("2026-03-24T12:00:00Z")),
        Some(at("2026-04-05T00:00:00Z"))
    );
    // In words.
    assert_eq!(
        win.describe(at("2026-03-24T12:00:00Z")),
        "opens at Sun 2026-04-05 02:00 CEST in Europe/Berlin"
    );
    assert_eq!(
        win.describe(at("2026-04-05T00:10:00Z")),
        "open until Sun 2026-04-05 03:00 CEST in Europe/Berlin"
    );
    let utc = w("UTC", &["fri"], "22:00", "04:00");
    assert_eq!(
        utc.describe(at("2026-12-01T00:00:00Z")),
        "opens at Fri 2026-12-04 22:00 UTC"
    );
}

#[test]
fn bad_input_is_refused_with_a_reason() {
    let err = |days: &[&str], start: &str, end: &str, tz: &str| {
        WindowSpec::parse(days, start, end, tz)
            .expect_err("refused")
            .to_string()
    };
    for (days, start, end, tz, says) in [
        (
            &["someday"][..],
            "01:00",
            "03:00",
            "UTC",
            "invalid window days: \"someday\" is not a day",
        ),
        (
            &["mon", "mo"],
            "01:00",
            "03:00",
            "UTC",
            "\"mo\" is not a day",
        ),
        (
            &["mondo"],
            "01:00",
            "03:00",
            "UTC",
            "\"mondo\" is not a day",
        ),
        (
            &[],
            "24:00",
            "03:00",
            "UTC",
            "invalid window start: \"24:00\" is not a time between 00:00 and 23:59",
        ),
        (
            &[],
            "01:00",
            "25:00",
            "UTC",
            "invalid window end: \"25:00\" is not a time between",
        ),
        (
            &[],
            "01:60",
            "03:00",
            "UTC",
            "\"01:60\" is not a time between",
        ),
        (&[], "2am", "03:00", "UTC", "\"2am\" is not HH:MM"),
        (&[], "02:0", "03:00", "UTC", "\"02:0\" is not HH:MM"),
        (&[], "+2:00", "03:00", "UTC", "\"+2:00\" is not HH:MM"),
        (&[], "02:00:00", "03:00", "UTC", "\"02:00:00\" is not HH:MM"),
        (&[], "", "03:00", "UTC", "\"\" is not HH:MM"),
        (
            &[],
            "01:00",
            "03:00",
            "Mars Base",
            "invalid window time zone: \"Mars Base\" is not an IANA time zone name",
        ),
        (&[], "01:00", "03:00", "", "is not an IANA time zone name"),
        (
            &[],
            "01:00",
            "03:00",
            "../../etc/passwd",
            "is not an IANA time zone name",
        ),
        (
            &[],
            "01:00",
            "03:00",
            "/etc/localtime",
            "is not an IANA time zone name",
        ),
        (
            &[],
            "01:00",
            "03:00",
            "+01:00",
            "is not an IANA time zone name",
        ),
        (
            &[],
            "02:00",
            "02:00",
            "UTC",
            "invalid window: start and end are both 02:00: a window must have a length",
        ),
        (
            &["sun"],
            "00:00",
            "0:00",
            "UTC",
            "start and end are both 00:00",
        ),
    ] {
        let e = err(days, start, end, tz);
        assert!(e.contains(says), "{days:?} {start} {end} {tz}: {e}");
    }
    // Accepted spellings.
    let ok = WindowSpec::parse(
        &["Monday", "FRI", "fri"],
        "2:00",
        "23:59",
        "America/Argentina/Buenos_Aires",
    )
    .expect("ok");
    assert_eq!(ok.days().names(), ["mon", "fri"]);
    assert_eq!(ok.start().to_string(), "02:00");
    assert!(WindowSpec::parse(&[] as &[&str], "00:00", "23:59", "Etc/GMT+1").is_ok());
}

#[cfg(feature = "os")]
#[test]
fn resolve_reads_the_system_tzdb() {
    let spec =
        WindowSpec::parse(&[] as &[&str], "01:00", "03:00", "Mars/Base").expect("syntax is fine");
    let e = Window::resolve(&spec)
        .expect_err("no such zone")
        .to_string();
    assert!(
        e.starts_with(
            "invalid window time zone: \"Mars/Base\" is not a time zone in the system tzdb"
        ),
        "{e}"
    );
    assert!(e.ends_with("install tzdata"), "{e}");
    let spec = WindowSpec::parse(&["sun"], "02:00", "05:00", "Europe/Berlin").expect("spec");
    let win = Window::resolve(&spec).expect("Europe/Berlin");
    assert!(win.contains(at("2026-03-29T01:00:00Z")));
}

#[test]
fn wire_form() {
    let spec: WindowSpec = serde_json::from_str(
        r#"{"days":["sun","Friday","fri"],"start":"22:00","end":"04:00","timeZone":"Europe/Berlin"}"#,
    )
    .expect("parses");
    assert_eq!(
        serde_json::to_string(&spec).expect("json"),
        r#"{"days":["fri","sun"],"start":"22:00","end":"04:00","timeZone":"Europe/Berlin"}"#
    );
    assert_eq!(spec.to_string(), "fri,sun 22:00–04:00 Europe/Berlin");
    assert!(spec.crosses_midnight());
    // No days: every day, written out.
    let every: WindowSpec =
        serde_json::from_str(r#"{"start":"2:00","end":"05:00","timeZone":"UTC"}"#).expect("parses");
    assert_eq!(every.days(), Days::EVERY);
    assert_eq!(
        serde_json::to_string(&every).expect("json"),
        r#"{"days":["mon","tue","wed","thu","fri","sat","sun"],"start":"02:00","end":"05:00","timeZone":"UTC"}"#
    );
    assert_eq!(every.to_string(), "every day 02:00–05:00 UTC");
    // Refused: bad values, unknown keys (the YAML spelling `timezone` too), a missing zone.
    for bad in [
        r#"{"start":"24:00","end":"05:00","timeZone":"UTC"}"#,
        r#"{"start":"05:00","end":"05:00","timeZone":"UTC"}"#,
        r#"{"days":["someday"],"start":"02:00","end":"05:00","timeZone":"UTC"}"#,
        r#"{"start":"02:00","end":"05:00","timezone":"UTC"}"#,
        r#"{"start":"02:00","end":"05:00"}"#,
        r#"{"start":"02:00","end":"05:00","timeZone":"UTC","graceSeconds":60}"#,
    ] {
        assert!(serde_json::from_str::<WindowSpec>(bad).is_err(), "{bad}");
    }
    let e =
        serde_json::from_str::<WindowSpec>(r#"{"start":"02:00","end":"25:00","timeZone":"UTC"}"#)
            .expect_err("refused")
            .to_string();
    assert!(e.contains("invalid window end: \"25:00\""), "{e}");
}

/// The reboot client's check before the window moved here: the clock's local time against start and end.
fn old_civil_check(win: &Window, now: Timestamp) -> bool {
    let spec = win.spec();
    let z = to_jiff(now).to_zoned(win.tz.clone());
    let t = u16::from(z.hour().unsigned_abs()) * 60 + u16::from(z.minute().unsigned_abs());
    let d = usize::from(z.weekday().to_monday_zero_offset().unsigned_abs());
    let prev = (d + 6) % 7;
    let (start, end) = (spec.start.minute_of_day, spec.end.minute_of_day);
    if start < end {
        spec.days.contains(d) && start <= t && t < end
    } else {
        (spec.days.contains(d) && t >= start) || (spec.days.contains(prev) && t < end)
    }
}

fn arbitrary_window(zone_name: &'static str) -> impl Strategy<Value = Window> {
    (1u8..128, 0u16..1440, 1u16..1440).prop_map(move |(days, start, len)| {
        let end = (start + len) % 1440;
        let t = |m: u16| {
            ClockTime::new(u8::try_from(m / 60).unwrap(), u8::try_from(m % 60).unwrap()).unwrap()
        };
        let spec = WindowSpec::new(
            Days(days),
            t(start),
            t(end),
            TimeZoneName::try_from(zone_name).unwrap(),
        )
        .unwrap();
        Window::with_zone(spec, zone(zone_name))
    })
}

/// 2026 in milliseconds, whole minutes (the old check read minutes only).
fn in_2026() -> impl Strategy<Value = Timestamp> {
    (0u64..365 * 1440).prop_map(|m| Timestamp::from_unix_ms(1_767_225_600_000 + m * 60_000))
}

/// Within two days of a clock change in Berlin (2026-03-29 and 2026-10-25).
fn near_a_change(t: Timestamp) -> bool {
    ["2026-03-29T01:00:00Z", "2026-10-25T01:00:00Z"]
        .iter()
        .any(|c| {
            let c = at(c);
            t.since(c).max(c.since(t)) < std::time::Duration::from_secs(2 * 86_400)
        })
}

proptest! {
    #[test]
    fn agrees_with_the_old_check_away_from_clock_changes(
        win in prop_oneof![arbitrary_window("UTC"), arbitrary_window("Europe/Berlin")],
        now in in_2026(),
    ) {
        prop_assume!(win.spec().time_zone().as_str() == "UTC" || !near_a_change(now));
        prop_assert_eq!(win.contains(now), old_civil_check(&win, now), "{} at {:?}", win.spec(), now);
    }

    #[test]
    fn states_are_consistent(
        win in prop_oneof![arbitrary_window("UTC"), arbitrary_window("Europe/Berlin")],
        now in in_2026(),
    ) {
        match win.state(now) {
            WindowState::Open { closes } => {
                prop_assert!(closes > now);
                prop_assert!(win.contains(Timestamp::from_unix_ms(closes.unix_ms() - 1)));
            }
            WindowState::Closed { opens } => {
                let opens = opens.expect("a listed day within four weeks");
                prop_assert!(opens > now);
                prop_assert!(win.contains(opens));
                prop_assert!(!win.contains(Timestamp::from_unix_ms(opens.unix_ms() - 1)));
                prop_assert_eq!(win.next_open(now), Some(opens));
            }
        }
    }
}
