use super::*;
use crate::machine::records::run;

fn limit(tools: Option<&str>, max_calls: Option<u64>, max_cost: Option<f64>) -> Limit {
    Limit {
        tools: tools.map(str::to_owned),
        max_calls,
        max_cost,
        max_time_ms: None,
        set_by: Some("request".into()),
        spent: Spent::default(),
        ask: None,
    }
}

fn budgeted(limits: Vec<Limit>) -> RunRecord {
    RunRecord {
        budget: Some(Budget {
            limits,
            under_parent: false,
        }),
        ..run()
    }
}

fn attempt(tool: &str, unit_cost: f64, first: bool) -> Attempt<'_> {
    Attempt {
        tool,
        unit_cost,
        first,
        timeout_ms: 0,
    }
}

/// Charges attempts until one is refused; how many started, and the refusal.
fn spend_until_refused(run: &mut RunRecord, next: Attempt<'_>) -> (usize, Exceeded) {
    for started in 0..1_000 {
        if let Err(exceeded) = check(&[&*run], next) {
            return (started, exceeded);
        }
        charge(run, next);
    }
    panic!("never refused: {:?}", run.budget);
}

#[test]
fn a_call_limit_counts_calls_not_attempts() {
    let mut run = budgeted(vec![limit(None, Some(3), None)]);
    let (started, Exceeded { message, .. }) = spend_until_refused(&mut run, attempt("lookup", 0.0, true));
    assert_eq!(started, 3);
    assert_eq!(
        message,
        format!("budget exceeded: calls 4 of 3 for run {}; 'lookup' did not run", run.id)
    );
    // A retry of a call that counted already counts no further call.
    assert_eq!(check(&[&run], attempt("lookup", 0.0, false)), Ok(()));
}

#[test]
fn a_cost_limit_charges_every_attempt_at_its_price_and_lets_free_calls_by() {
    let mut run = budgeted(vec![limit(None, None, Some(1.0))]);
    let (started, Exceeded { message, .. }) = spend_until_refused(&mut run, attempt("search", 0.3, false));
    assert_eq!(started, 3, "0.9 spent, 1.2 would pass 1.0");
    assert!(
        message.starts_with("budget exceeded: cost 1.20 of 1.00 for run "),
        "{message}"
    );
    assert_eq!(
        check(&[&run], attempt("free", 0.0, true)),
        Ok(()),
        "a free call costs nothing"
    );
    // Prices that sum to the limit inexactly in binary still fit it.
    let mut exact = budgeted(vec![limit(None, None, Some(0.3))]);
    let (started, _) = spend_until_refused(&mut exact, attempt("search", 0.1, true));
    assert_eq!(started, 3);
    assert_eq!(overspent(&exact), None);
}

#[test]
fn a_limit_on_a_glob_counts_only_the_tools_it_names() {
    let mut run = budgeted(vec![limit(Some("payments_*"), Some(1), None)]);
    charge(&mut run, attempt("payments_refund", 0.0, true));
    charge(&mut run, attempt("lookup", 0.0, true));
    assert_eq!(run.budget.as_ref().unwrap().limits[0].spent.calls, 1);
    assert_eq!(check(&[&run], attempt("lookup", 0.0, true)), Ok(()));
    let Err(Exceeded { message, .. }) = check(&[&run], attempt("payments_charge", 0.0, true)) else {
        panic!("the second payment passed");
    };
    assert!(message.contains("calls 2 of 1 on 'payments_*'"), "{message}");
}

#[test]
fn an_ancestor_s_budget_refuses_a_call_its_subagent_s_own_allows() {
    let parent = budgeted(vec![limit(None, Some(1), None)]);
    let mut spent = parent.clone();
    charge(&mut spent, attempt("lookup", 0.0, true));
    let child = RunRecord {
        id: crate::model::RunId::new(),
        parent: Some((parent.id.clone(), crate::model::StepKey::from_stored("t0/p0".into()))),
        budget: for_new_run(vec![limit(None, Some(10), None)], Some(&parent)),
        ..run()
    };
    assert_eq!(next_account(&child), Some(&parent.id));
    assert_eq!(check(&[&child, &parent], attempt("lookup", 0.0, true)), Ok(()));
    let Err(Exceeded { message, .. }) = check(&[&child, &spent], attempt("lookup", 0.0, true)) else {
        panic!("the parent's spent budget let the child's call by");
    };
    assert!(
        message.contains(&format!("for run {} (an ancestor of run {})", parent.id, child.id)),
        "{message}"
    );
}

#[test]
fn a_new_run_has_a_budget_only_when_something_limits_it() {
    assert_eq!(for_new_run(Vec::new(), None), None);
    assert_eq!(for_new_run(Vec::new(), Some(&run())), None, "a parent without a budget");
    let parent = budgeted(vec![limit(None, Some(1), None)]);
    let child = for_new_run(Vec::new(), Some(&parent)).expect("under its parent's budget");
    assert!(child.under_parent && child.limits.is_empty());
    let own = for_new_run(vec![limit(None, None, Some(2.0))], None).expect("its own");
    assert!(!own.under_parent);
}

#[test]
fn a_branch_asks_for_its_parent_s_own_limits_with_nothing_spent() {
    let mut from_policy = limit(None, Some(5), None);
    from_policy.set_by = Some("policy:budgets[0]".into());
    let mut parent = budgeted(vec![limit(Some("pay*"), None, Some(3.0)), from_policy]);
    charge(&mut parent, attempt("pay", 1.0, true));
    let branch = for_branch(&parent);
    assert_eq!(branch.len(), 1, "the policy gives the branch its own by its labels");
    assert_eq!(branch[0].tools.as_deref(), Some("pay*"));
    assert_eq!(branch[0].set_by.as_deref(), Some("parent"));
    assert_eq!(branch[0].spent, Spent::default());
}

#[test]
fn the_budget_column_round_trips_and_reads_an_absent_field_as_its_default() {
    let mut run = budgeted(vec![limit(Some("x*"), Some(2), Some(1.5))]);
    charge(&mut run, attempt("xy", 0.5, true));
    let text = serde_json::to_string(&run.budget).unwrap();
    assert_eq!(serde_json::from_str::<Option<Budget>>(&text).unwrap(), run.budget);
    let bare: Budget = serde_json::from_str(r#"{"limits":[{"max_calls":1}]}"#).unwrap();
    assert_eq!(bare.limits[0].spent, Spent::default());
    assert!(!bare.under_parent);
}

#[test]
fn a_time_limit_waits_while_running_attempts_hold_what_would_fit_and_refuses_what_never_can() {
    let mut run = budgeted(vec![Limit {
        max_time_ms: Some(60_000),
        ..limit(None, None, None)
    }]);
    let timed = |timeout_ms| Attempt {
        timeout_ms,
        ..attempt("slow", 0.0, true)
    };
    charge(&mut run, timed(40_000));
    let held = check(&[&run], timed(30_000)).unwrap_err();
    assert!(held.waits, "40 s held may come back: {held:?}");
    let never = check(&[&run], timed(70_000)).unwrap_err();
    assert!(!never.waits, "70 s never fits 60 s");
    settle(
        &mut run,
        Ended {
            tool: "slow",
            timeout_ms: 40_000,
            ran_ms: 50_000,
        },
    );
    let spent = run.budget.as_ref().unwrap().limits[0].spent;
    assert_eq!((spent.time_ms, spent.reserved_ms), (40_000, 0), "at most its timeout");
    assert_eq!(check(&[&run], timed(20_000)), Ok(()));
    let refused = check(&[&run], timed(30_000)).unwrap_err();
    assert!(!refused.waits && refused.ask.is_none(), "{refused:?}");
}

#[test]
fn the_raise_schema_names_every_bound_an_answer_may_raise_and_nothing_else() {
    let schema: serde_json::Value = serde_json::from_str(RAISE_SCHEMA).unwrap();
    let properties = schema["properties"].as_object().unwrap();
    for (name, shape) in properties {
        let value = if shape["type"] == "integer" { "7" } else { "7.5" };
        let answer = format!("{{\"{name}\": {value}}}");
        assert!(Raise::parse(&answer).is_ok(), "{answer}");
    }
    assert_eq!(
        properties.keys().map(String::as_str).collect::<Vec<_>>(),
        ["max_calls", "max_cost", "max_time_ms"]
    );
    assert!(Raise::parse(r#"{"max_wait": 1}"#).is_err());
    let mut run = budgeted(vec![Limit {
        max_time_ms: Some(60_000),
        ..limit(None, None, None)
    }]);
    let lower = Raise::parse(r#"{"max_time_ms": 1000}"#).unwrap();
    assert!(
        raise(&mut run, 0, lower, "finance")
            .unwrap_err()
            .contains("never lowers")
    );
    let higher = Raise::parse(r#"{"max_time_ms": 90000}"#).unwrap();
    raise(&mut run, 0, higher, "finance").unwrap();
    assert_eq!(run.budget.as_ref().unwrap().limits[0].max_time_ms, Some(90_000));
}
