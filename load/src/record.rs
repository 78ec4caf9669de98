//! What the load loop saw, request by request, and the report it makes of it against the
//! phases a driver marked: which change each failure fell in, and how long after a change
//! each answer first came back.

use serde_json::{Value, json};

/// One request's outcome: the answer's body (a 2xx), or why it failed.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Answered(String),
    Failed(String),
}

/// One request: when it was sent (seconds since the epoch) and what came of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub at: f64,
    pub outcome: Outcome,
}

/// A change the driver marked: from `start` (seconds since the epoch) until the next one.
#[derive(Debug, Clone, PartialEq)]
pub struct Phase {
    pub start: f64,
    pub name: String,
}

/// Reads the phases file: one `<seconds since the epoch> <name>` per line, as
/// `echo "$(date +%s.%N) rollback" >>FILE` writes it; a line that does not parse is skipped.
pub fn parse_phases(text: &str) -> Vec<Phase> {
    let mut phases: Vec<Phase> = text
        .lines()
        .filter_map(|line| {
            let (start, name) = line.trim().split_once(char::is_whitespace)?;
            Some(Phase {
                start: start.parse().ok()?,
                name: name.trim().to_string(),
            })
        })
        .collect();
    phases.sort_by(|a, b| a.start.total_cmp(&b.start));
    phases
}

/// The rate the last phase naming one set: a word `rate=N` in its name (`(rate=20):` too).
pub fn rate_set_by(phases: &[Phase]) -> Option<u32> {
    phases.iter().rev().find_map(|phase| {
        phase.name.split_whitespace().find_map(|word| {
            word.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '=')
                .strip_prefix("rate=")?
                .parse()
                .ok()
        })
    })
}

/// How many answers of each phase are reported with the time they first came.
const FIRST_ANSWERS_SHOWN: usize = 5;

/// The report: totals, one row per phase (requests before the first phase make a phase
/// `(before)`), and every failure with its phase.
pub fn report(records: &[Record], phases: &[Phase], retried: u64) -> Value {
    let mut sorted: Vec<&Record> = records.iter().collect();
    sorted.sort_by(|a, b| a.at.total_cmp(&b.at));
    let first = sorted.first().map_or(0.0, |record| record.at);
    let last = sorted.last().map_or(0.0, |record| record.at);
    // Sorted by time, each phase's requests are one run: from its start to the next one's.
    let from = |start: f64| sorted.partition_point(|record| record.at < start);

    let mut rows: Vec<Value> = Vec::new();
    let mut failures: Vec<Value> = Vec::new();
    let names = std::iter::once(("(before)".to_string(), first))
        .chain(phases.iter().map(|phase| (phase.name.clone(), phase.start)));
    for (index, (name, start)) in names.enumerate() {
        let phase = index.checked_sub(1);
        let end = phases.get(index).map_or(last, |next| next.start);
        let begin = if phase.is_some() { from(start) } else { 0 };
        let finish = phases.get(index).map_or(sorted.len(), |next| from(next.start));
        let inside = &sorted[begin..finish.max(begin)];
        if phase.is_none() && inside.is_empty() {
            continue;
        }
        let mut first_answers: Vec<(String, f64)> = Vec::new();
        let mut failed = 0;
        for record in inside {
            match &record.outcome {
                Outcome::Answered(body) => {
                    if first_answers.len() < FIRST_ANSWERS_SHOWN && first_answers.iter().all(|(seen, _)| seen != body) {
                        first_answers.push((body.clone(), record.at - start));
                    }
                }
                Outcome::Failed(cause) => {
                    failed += 1;
                    failures.push(
                        json!({"at": record.at, "after_start": record.at - first, "phase": name, "cause": cause}),
                    );
                }
            }
        }
        rows.push(json!({
            "phase": name,
            "start": start,
            "seconds": (end - start).max(0.0),
            "requests": inside.len(),
            "failed": failed,
            "first_answers": first_answers.iter().map(|(body, after)| json!({"answer": body, "after": after})).collect::<Vec<_>>(),
        }));
    }
    let seconds = last - first;
    json!({
        "requests": records.len(),
        "failed": failures.len(),
        "retried_on_new_connection": retried,
        "seconds": seconds,
        "rate": if seconds > 0.0 { records.len() as f64 / seconds } else { 0.0 },
        "phases": rows,
        "failures": failures,
    })
}

/// How many failures are printed one by one before they are counted by cause and phase.
const FAILURES_LISTED: usize = 30;

/// The report as a person reads it: a row per phase, then each failure.
pub fn render(report: &Value) -> String {
    let mut out = String::new();
    out.push_str("seconds  requests  failed  phase: first answers (s after the phase began)\n");
    for row in report["phases"].as_array().into_iter().flatten() {
        let answers: Vec<String> = row["first_answers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|answer| {
                format!(
                    "{} at {:.2}",
                    answer["answer"].as_str().unwrap_or(""),
                    answer["after"].as_f64().unwrap_or(0.0)
                )
            })
            .collect();
        out.push_str(&format!(
            "{:>7.1} {:>9} {:>7}  {}: {}\n",
            row["seconds"].as_f64().unwrap_or(0.0),
            row["requests"].as_u64().unwrap_or(0),
            row["failed"].as_u64().unwrap_or(0),
            row["phase"].as_str().unwrap_or(""),
            answers.join(", ")
        ));
    }
    let failures = report["failures"].as_array().map_or(&[][..], Vec::as_slice);
    for failure in failures.iter().take(FAILURES_LISTED) {
        out.push_str(&format!(
            "FAILED at {:.3} s [{}]: {}\n",
            failure["after_start"].as_f64().unwrap_or(0.0),
            failure["phase"].as_str().unwrap_or(""),
            failure["cause"].as_str().unwrap_or("")
        ));
    }
    if failures.len() > FAILURES_LISTED {
        out.push_str(&format!(
            "... {} more failures (each in the JSON report); all of them by cause and phase:\n",
            failures.len() - FAILURES_LISTED
        ));
        let mut counts: Vec<((&str, &str), usize)> = Vec::new();
        for failure in failures {
            let key = (
                failure["cause"].as_str().unwrap_or(""),
                failure["phase"].as_str().unwrap_or(""),
            );
            match counts.iter_mut().find(|(seen, _)| *seen == key) {
                Some((_, count)) => *count += 1,
                None => counts.push((key, 1)),
            }
        }
        for ((cause, phase), count) in counts {
            out.push_str(&format!("{count:>7} x [{phase}]: {cause}\n"));
        }
    }
    out.push_str(&format!(
        "{} requests in {:.1} s ({:.0}/s), {} failed, {} retried on a new connection after the server closed an idle one\n",
        report["requests"],
        report["seconds"].as_f64().unwrap_or(0.0),
        report["rate"].as_f64().unwrap_or(0.0),
        report["failed"],
        report["retried_on_new_connection"]
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(at: f64, body: &str) -> Record {
        Record {
            at,
            outcome: Outcome::Answered(body.into()),
        }
    }

    #[test]
    fn failures_fall_in_the_phase_marked_before_them_and_answers_are_timed_from_its_start() {
        let phases = parse_phases("110.0 rollback\nnot a phase\n100.0 edit\n");
        assert_eq!(
            phases.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
            ["edit", "rollback"]
        );
        let records = vec![
            answered(99.0, "v1"),
            answered(101.0, "v1"),
            answered(103.5, "v2"),
            Record {
                at: 110.2,
                outcome: Outcome::Failed("connect: No route to host".into()),
            },
            answered(111.25, "v1"),
            answered(112.0, "v2"),
        ];
        let report = report(&records, &phases, 2);
        assert_eq!(report["requests"], 6);
        assert_eq!(report["failed"], 1);
        assert_eq!(report["retried_on_new_connection"], 2);
        let rows = report["phases"].as_array().unwrap();
        assert_eq!(
            rows.iter()
                .map(|row| row["phase"].as_str().unwrap())
                .collect::<Vec<_>>(),
            ["(before)", "edit", "rollback"]
        );
        assert_eq!(rows[1]["requests"], 2);
        assert_eq!(rows[1]["seconds"], 10.0);
        assert_eq!(rows[1]["first_answers"][1]["answer"], "v2");
        assert_eq!(rows[1]["first_answers"][1]["after"], 3.5);
        assert_eq!(rows[2]["failed"], 1);
        assert_eq!(rows[2]["first_answers"][0]["after"], 1.25);
        assert_eq!(report["failures"][0]["phase"], "rollback");
        let text = render(&report);
        assert!(
            text.contains("FAILED at 11.200 s [rollback]: connect: No route to host"),
            "{text}"
        );
        assert!(text.contains("6 requests in 13.0 s"), "{text}");
    }

    #[test]
    fn the_last_phase_naming_a_rate_sets_it() {
        assert_eq!(rate_set_by(&parse_phases("1 start\n")), None);
        let phases = parse_phases("1 little traffic (rate=20): to zero\n2 a pool pod deleted\n");
        assert_eq!(rate_set_by(&phases), Some(20));
        let phases = parse_phases("1 little (rate=20)\n2 pod deleted\n3 again rate=1000\n");
        assert_eq!(rate_set_by(&phases), Some(1000));
    }

    #[test]
    fn many_failures_are_listed_up_to_a_point_then_counted_by_cause_and_phase() {
        let phases = parse_phases("10 edit\n");
        let mut records: Vec<Record> = (0..40)
            .map(|i| Record {
                at: 11.0 + f64::from(i),
                outcome: Outcome::Failed("connect: refused".into()),
            })
            .collect();
        records.push(Record {
            at: 60.0,
            outcome: Outcome::Failed("HTTP 503".into()),
        });
        let text = render(&report(&records, &phases, 0));
        assert_eq!(text.matches("FAILED at").count(), FAILURES_LISTED, "{text}");
        assert!(text.contains("... 11 more failures"), "{text}");
        assert!(text.contains("     40 x [edit]: connect: refused\n"), "{text}");
        assert!(text.contains("      1 x [edit]: HTTP 503\n"), "{text}");
    }

    #[test]
    fn without_phases_every_request_is_before() {
        let report = report(&[answered(5.0, "ok")], &[], 0);
        assert_eq!(report["phases"][0]["phase"], "(before)");
        assert_eq!(report["failed"], 0);
    }
}
