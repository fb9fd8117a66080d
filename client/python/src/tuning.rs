//! The rank flow for Python callers: `tunecache-client`'s `get_or_tune_traced` runs on the
//! process runtime, and when the daemon hands out a lease, the flow asks the calling thread
//! to run the Python `tune` callable (with the GIL, on the thread that called, so CUDA contexts
//! and thread-locals are the caller's) and waits for its answer. Resolve, Record and giving the
//! lease up are the Rust client's; this module only carries `tune` across.

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::PyList;
use tokio::sync::oneshot;
use tunecache_client::{proto as v1, FlowCall, RankOutcome as RustOutcome, ResolveOptions};

use crate::client::CallContext;
use crate::errors::client_error;
use crate::messages::TunedResult;
use crate::runtime::{run_serving, Event};

/// The flow's request to the calling thread: run `tune`, answer its result or why it failed.
pub struct TuneRequest {
    answer: oneshot::Sender<Result<v1::Result, String>>,
}

/// How the flow ended, for the Python layer to present: `kind` is "cached", "tuned" or
/// "fallback"; `result` the result (None for a fallback); `reason` why it fell back;
/// `failures` the daemon calls that failed on the way, as `(call, exception)` pairs, call being
/// "Resolve", "Record" or "Record (giving the lease up)"; `raised` what `tune()` raised (the
/// lease was given up; the caller raises it again or falls back).
#[pyclass(module = "tunecache._native", name = "RankOutcome", frozen, get_all)]
pub struct RankOutcome {
    pub kind: &'static str,
    pub result: Option<Py<TunedResult>>,
    pub reason: String,
    pub failures: Py<PyList>,
    pub raised: Option<Py<PyAny>>,
}

fn call_name(call: FlowCall) -> &'static str {
    match call {
        FlowCall::Resolve => "Resolve",
        FlowCall::Record => "Record",
        FlowCall::GiveUpLease => "Record (giving the lease up)",
    }
}

/// `tune()`'s answer `(config_text, time_us, tuned_by, tuned_at_unix_ms)`, or with a fifth
/// element, the artifacts the result names (uploaded already: `Client.put_artifacts`), as a
/// Result.
fn tuned_result(answer: &Bound<'_, PyAny>) -> PyResult<v1::Result> {
    let (config, time_us, tuned_by, tuned_at_unix_ms, artifacts) =
        match answer.extract::<(String, f64, String, i64)>() {
            Ok((config, time_us, tuned_by, at)) => (config, time_us, tuned_by, at, Vec::new()),
            Err(_) => {
                let (config, time_us, tuned_by, at, artifacts): (
                    String,
                    f64,
                    String,
                    i64,
                    Bound<'_, PyAny>,
                ) = answer.extract()?;
                (
                    config,
                    time_us,
                    tuned_by,
                    at,
                    crate::messages::Artifact::extract_list(&artifacts)?,
                )
            }
        };
    Ok(v1::Result {
        config,
        time_us,
        tuned_by,
        tuned_at_unix_ms,
        forget_epoch: 0,
        artifacts,
    })
}

pub fn resolve_tune_record(
    py: Python<'_>,
    context: CallContext,
    key: v1::Key,
    options: ResolveOptions,
    tune: Py<PyAny>,
) -> PyResult<RankOutcome> {
    // What tune() raised: raised again once the flow has given the lease up.
    let raised: Arc<Mutex<Option<PyErr>>> = Arc::default();
    let raised_by_tune = Arc::clone(&raised);
    let flow = run_serving(
        py,
        move |requests| async move {
            let client = match context.client(None).await {
                Ok(client) => client,
                Err(error) => return Err(error),
            };
            let ask_the_caller = move || async move {
                let (answer, answered) = oneshot::channel();
                if requests
                    .send(Event::Request(TuneRequest { answer }))
                    .is_err()
                {
                    return Err("the calling thread is gone".to_owned());
                }
                answered
                    .await
                    .unwrap_or_else(|_| Err("the calling thread stopped waiting".to_owned()))
            };
            Ok(client
                .get_or_tune_traced(key, options, ask_the_caller)
                .await)
        },
        move |py, request: TuneRequest| {
            let answer = tune
                .bind(py)
                .call0()
                .and_then(|answer| tuned_result(&answer))
                .map_err(|error| {
                    let reason = error.to_string();
                    if let Ok(mut slot) = raised_by_tune.lock() {
                        *slot = Some(error);
                    }
                    reason
                });
            // The flow may have been dropped meanwhile; then nobody needs the answer.
            let _ = request.answer.send(answer);
            Ok(())
        },
    )?;
    let raised = raised
        .lock()
        .ok()
        .and_then(|mut slot| slot.take())
        .map(|error| error.into_value(py).into_any());
    let (outcome, failures) = match flow {
        Ok(traced) => traced,
        // Could not even connect: the Resolve failed.
        Err(error) => (
            RustOutcome::Fallback(format!("tunecache unavailable: {error}")),
            vec![tunecache_client::FlowFailure {
                call: FlowCall::Resolve,
                error,
            }],
        ),
    };
    let failures = failures
        .into_iter()
        .map(|failure| {
            let exception = client_error(py, failure.error).into_value(py);
            (call_name(failure.call), exception)
        })
        .collect::<Vec<_>>();
    let failures = PyList::new(py, failures)?.unbind();
    Ok(match outcome {
        RustOutcome::Cached(result) => RankOutcome {
            kind: "cached",
            result: Some(Py::new(py, TunedResult::from_proto(result))?),
            reason: String::new(),
            failures,
            raised: None,
        },
        RustOutcome::Tuned(result) => RankOutcome {
            kind: "tuned",
            result: Some(Py::new(py, TunedResult::from_proto(result))?),
            reason: String::new(),
            failures,
            raised: None,
        },
        RustOutcome::Fallback(reason) => RankOutcome {
            kind: "fallback",
            result: None,
            reason,
            failures,
            raised,
        },
    })
}
