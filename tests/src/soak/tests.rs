//! The checker's unit tests: hand-written histories, healthy and broken.

use std::collections::BTreeMap;

use super::*;

const MS: u64 = 1_000_000;

fn k(s: &str) -> String {
    s.to_owned()
}

/// A worker's log of `cycles`: (key, fence, tok, acquire at ms, hold ms).
fn cycles(worker: usize, list: &[(&str, u64, &str, u64, u64)]) -> String {
    let mut log = Event::Start { worker, inc: 0, pid: 100 + worker as u32, t: 0 }.to_line();
    log += &Event::Ready { t: MS }.to_line();
    for &(key, fence, tok, at, hold) in list {
        let (key, tok, at) = (k(key), k(tok), at * MS);
        log += &Event::Wait { key: key.clone(), t: at }.to_line();
        log += &Event::Grant { key: key.clone(), fence, tok: tok.clone(), t0: at, t1: at + MS }.to_line();
        log += &Event::Valid { key: key.clone(), tok: tok.clone(), t0: at + 2 * MS, t1: at + 2 * MS + 1 }.to_line();
        let w = at + hold * MS / 2;
        log += &Event::Write {
            key: key.clone(),
            tok: tok.clone(),
            fence,
            accepted: true,
            highest: fence - 1,
            t0: w,
            t1: w + MS,
        }
        .to_line();
        let end = at + hold * MS;
        log += &Event::Valid { key: key.clone(), tok: tok.clone(), t0: end, t1: end + 1 }.to_line();
        log += &Event::Release { key, tok, outcome: k("released"), t0: end + 1, t1: end + MS }.to_line();
    }
    log += &Event::Exit { t: 100_000 * MS }.to_line();
    log
}

fn incarnation(worker: usize, log: String) -> Incarnation {
    Incarnation { worker, inc: 0, log, killed: false, exit_code: Some(0) }
}

/// Two workers taking turns on key a (fences 1..4), and each once more after the heal at 1000 ms.
fn clean() -> History {
    let w0 = cycles(0, &[("a", 1, "aaaa0001", 10, 50), ("a", 3, "aaaa0003", 130, 50), ("b", 1, "bbbb0001", 1100, 20)]);
    let w1 = cycles(1, &[("a", 2, "aaaa0002", 70, 50), ("a", 4, "aaaa0004", 190, 50), ("a", 5, "aaaa0005", 1200, 20)]);
    History {
        workers: 2,
        incarnations: vec![incarnation(0, w0), incarnation(1, w1)],
        register: BTreeMap::from([(k("a"), vec![1, 2, 3, 4, 5]), (k("b"), vec![1])]),
        healed_at: 1000 * MS,
        origin: 0,
    }
}

fn only(verdict: &Verdict, check: Check) {
    assert!(!verdict.passed(), "expected a {check:?} violation, the history passed:\n{verdict}");
    assert!(verdict.violations.iter().all(|v| v.check == check), "expected only {check:?}:\n{verdict}");
}

#[test]
fn a_clean_history_passes() {
    let verdict = check(&clean());
    assert!(verdict.passed(), "{verdict}");
    assert_eq!(verdict.stats.grants, 6);
    assert_eq!(verdict.stats.certain, 6);
    assert_eq!(verdict.stats.accepted, 6);
}

#[test]
fn overlapping_certain_intervals_are_flagged() {
    let mut h = clean();
    // w1's second grant (fence 4) starts at 150 ms, inside w0's fence-3 grant (130..180 ms).
    let w1 = cycles(1, &[("a", 2, "aaaa0002", 70, 50), ("a", 4, "aaaa0004", 150, 50), ("a", 5, "aaaa0005", 1200, 20)]);
    h.incarnations[1] = incarnation(1, w1);
    let verdict = check(&h);
    only(&verdict, Check::Overlap);
    let text = verdict.to_string();
    assert!(
        text.contains("certainly valid at once") && text.contains("aaaa0003") && text.contains("aaaa0004"),
        "{text}"
    );
}

#[test]
fn a_paused_holder_whose_last_valid_observation_came_before_the_next_grant_is_not_flagged() {
    // w0's fence-3 grant was last seen valid at 132 ms, then its holder was paused and woke up lost: the
    // next grant at 150 ms overlaps only the holder's unverified belief, which the checker must not flag.
    let mut log = cycles(0, &[("a", 1, "aaaa0001", 10, 50), ("b", 1, "bbbb0001", 1100, 20)]);
    log += &Event::Grant { key: k("a"), fence: 3, tok: k("aaaa0003"), t0: 130 * MS, t1: 131 * MS }.to_line();
    log += &Event::Valid { key: k("a"), tok: k("aaaa0003"), t0: 132 * MS, t1: 132 * MS + 1 }.to_line();
    log += &Event::Lost { key: k("a"), tok: k("aaaa0003"), t0: 700 * MS, t1: 700 * MS + 1 }.to_line();
    log += &Event::Release { key: k("a"), tok: k("aaaa0003"), outcome: k("expired"), t0: 701 * MS, t1: 701 * MS }
        .to_line();
    log += &Event::Exit { t: 100_000 * MS }.to_line();
    let w1 = cycles(1, &[("a", 2, "aaaa0002", 70, 50), ("a", 4, "aaaa0004", 150, 50), ("a", 5, "aaaa0005", 1200, 20)]);
    let mut h = clean();
    h.incarnations = vec![incarnation(0, log), incarnation(1, w1)];
    h.register.insert(k("a"), vec![1, 2, 4, 5]);
    let verdict = check(&h);
    assert!(verdict.passed(), "{verdict}");
}

#[test]
fn a_decreasing_register_is_flagged() {
    let mut h = clean();
    h.register.insert(k("a"), vec![1, 3, 2, 4, 5]);
    let verdict = check(&h);
    only(&verdict, Check::Register);
    assert!(verdict.to_string().contains("accepted token 2 after 3"), "{verdict}");
}

#[test]
fn a_rejected_write_while_certainly_valid_is_flagged() {
    let mut h = clean();
    let log = h.incarnations[0].log.replace(
        r#""tok":"aaaa0003","fence":3,"accepted":true,"highest":2"#,
        r#""tok":"aaaa0003","fence":3,"accepted":false,"highest":4"#,
    );
    assert_ne!(log, h.incarnations[0].log);
    h.incarnations[0].log = log;
    h.register.insert(k("a"), vec![1, 2, 4, 5]);
    let verdict = check(&h);
    only(&verdict, Check::Register);
    assert!(verdict.to_string().contains("rejected a write of token 3"), "{verdict}");
}

#[test]
fn an_accepted_write_missing_from_the_register_is_flagged() {
    let mut h = clean();
    h.register.insert(k("a"), vec![1, 2, 4, 5]);
    only(&check(&h), Check::Register);
}

#[test]
fn fencing_tokens_falling_in_real_time_are_flagged() {
    let mut h = clean();
    // w1's grant at 190 ms carries fence 2, below w0's fence 3 granted at 130 ms.
    let w1 = cycles(1, &[("a", 4, "aaaa0004", 70, 50), ("a", 2, "aaaa0002", 190, 50), ("a", 5, "aaaa0005", 1200, 20)]);
    h.incarnations[1] = incarnation(1, w1);
    h.register.insert(k("a"), vec![1, 4, 5]);
    let verdict = check(&h);
    assert!(!verdict.of(Check::Overlap).is_empty(), "{verdict}");
    assert!(verdict.to_string().contains("did not rise"), "{verdict}");
}

#[test]
fn a_worker_without_progress_after_the_heal_is_flagged() {
    let mut h = clean();
    let w0 = cycles(0, &[("a", 1, "aaaa0001", 10, 50), ("a", 3, "aaaa0003", 130, 50)]);
    h.incarnations[0] = incarnation(0, w0);
    h.register.insert(k("b"), vec![]);
    let verdict = check(&h);
    only(&verdict, Check::Progress);
    assert!(verdict.to_string().contains("w0: no grant"), "{verdict}");
}

#[test]
fn a_grant_after_the_heal_that_was_not_released_is_no_progress() {
    let mut h = clean();
    h.incarnations[1].log = h.incarnations[1]
        .log
        .replace(r#""tok":"aaaa0005","outcome":"released""#, r#""tok":"aaaa0005","outcome":"expired""#);
    only(&check(&h), Check::Progress);
}

#[test]
fn a_truncated_last_line_of_a_killed_worker_is_tolerated() {
    let mut h = clean();
    let mut killed = cycles(2, &[("c", 1, "cccc0001", 20, 10)]);
    killed = killed.replace(&Event::Exit { t: 100_000 * MS }.to_line(), "");
    killed += r#"{"ev":"grant","key":"c","fen"#;
    h.incarnations.push(Incarnation { worker: 2, inc: 0, log: killed, killed: true, exit_code: None });
    let mut after = cycles(2, &[("c", 2, "cccc0002", 1300, 10)]);
    after = after.replace(r#""inc":0"#, r#""inc":1"#);
    h.incarnations.push(Incarnation { worker: 2, inc: 1, log: after, killed: false, exit_code: Some(0) });
    h.workers = 3;
    h.register.insert(k("c"), vec![1, 2]);
    let verdict = check(&h);
    assert!(verdict.passed(), "{verdict}");
    assert_eq!(verdict.stats.truncated, 1);
}

#[test]
fn a_malformed_line_of_a_worker_that_was_not_killed_is_flagged() {
    let mut h = clean();
    h.incarnations[0].log.insert_str(0, "{\"ev\":\"gra\n");
    only(&check(&h), Check::Log);
}

#[test]
fn a_malformed_line_before_the_last_is_flagged_even_when_killed() {
    let mut h = clean();
    h.incarnations[0].log.insert_str(0, "garbage\n");
    h.incarnations[0].killed = true;
    only(&check(&h), Check::Log);
}

#[test]
fn panics_crashes_and_hangs_are_flagged() {
    let mut h = clean();
    h.incarnations[0].log += &Event::Panic { msg: k("boom"), t: 5 }.to_line();
    only(&check(&h), Check::Exit);

    let mut h = clean();
    h.incarnations[0].exit_code = Some(101);
    only(&check(&h), Check::Exit);

    let mut h = clean();
    h.incarnations[1].exit_code = None;
    let verdict = check(&h);
    only(&verdict, Check::Exit);
    assert!(verdict.to_string().contains("hung"), "{verdict}");
}

#[test]
fn a_violation_names_its_grants_and_their_lines_can_be_shown() {
    let mut h = clean();
    let w1 = cycles(1, &[("a", 2, "aaaa0002", 70, 50), ("a", 4, "aaaa0004", 150, 50), ("a", 5, "aaaa0005", 1200, 20)]);
    h.incarnations[1] = incarnation(1, w1.clone());
    let verdict = check(&h);
    let grants = &verdict.of(Check::Overlap)[0].grants;
    assert_eq!(grants, &vec![(0, 0, k("aaaa0003")), (1, 0, k("aaaa0004"))]);
    let lines = grant_lines(&w1, "aaaa0004");
    assert!(lines.contains("\"ev\":\"grant\"") && lines.contains("\"ev\":\"release\""), "{lines}");
    assert_eq!(lines.lines().count(), 5, "{lines}");
}

#[test]
fn progress_is_a_grant_since_then_released() {
    let log = cycles(0, &[("a", 1, "aaaa0001", 10, 50), ("b", 1, "bbbb0001", 1100, 20)]);
    assert!(progressed(&log, 1000 * MS));
    assert!(!progressed(&log, 1101 * MS));
    assert!(!progressed(&log.replace("released", "expired"), 1000 * MS));
}

#[test]
fn the_generator_repeats_with_its_seed() {
    let a: Vec<u64> = (0..5).scan(Rng::new(7), |r, _| Some(r.next_u64())).collect();
    let b: Vec<u64> = (0..5).scan(Rng::new(7), |r, _| Some(r.next_u64())).collect();
    assert_eq!(a, b);
    let mut r = Rng::new(1);
    assert!((0..1000).map(|_| r.range(3, 5)).all(|x| (3..=5).contains(&x)));
}

#[test]
fn the_clock_is_monotonic() {
    let a = now_ns();
    let b = now_ns();
    assert!(b >= a && a > 0);
}
