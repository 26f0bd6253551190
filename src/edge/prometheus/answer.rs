//! Reading what a Prometheus-compatible backend answered to one instant query: the samples, or a short
//! reason. The body is the backend's, and so not trusted: nothing of it reaches a message but the API's
//! own `errorType` and `error` fields, cleaned and cut short, and no input makes this panic.

use std::collections::BTreeMap;

use serde::{
    Deserialize, Deserializer,
    de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor, value::MapAccessDeserializer},
};

use crate::core::analysis::{Answer, Sample};

/// The most samples one answer may hold: a query that answers more is not judged (status keeps a few,
/// and a metric gating a rollout should aggregate).
pub const MAX_SAMPLES: usize = 10_000;
/// The longest reason an answer gives, in characters.
const REASON_MAX: usize = 300;

/// The envelope every API answer has, read first without its data.
#[derive(Deserialize)]
struct Envelope {
    status: String,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

/// A successful answer's data, read second.
#[derive(Deserialize)]
struct Success {
    data: Data,
}

#[derive(Deserialize)]
struct Data {
    #[serde(rename = "resultType")]
    result_type: String,
    #[serde(default)]
    result: Option<Found>,
}

/// A result: a list of series (vector, matrix) or one `[<time>, "<value>"]` (scalar, string). Told apart
/// by its first element as it streams by: an untagged enum would buffer the whole body first.
enum Found {
    Point(Value),
    Series(Vec<Series>),
}

/// `[<unix time>, "<value>"]`; the time is not needed.
type Point = (IgnoredAny, Value);

#[derive(Deserialize)]
#[serde(untagged)]
enum Value {
    Text(String),
    Number(f64),
}

/// One series: an instant vector's has `value`, a range vector's `values`; native histograms come as
/// `histogram(s)` instead, which have no single value.
#[derive(Deserialize)]
struct Series {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    #[serde(default)]
    value: Option<Point>,
    #[serde(default)]
    values: Option<Vec<Point>>,
    #[serde(default)]
    histogram: Option<IgnoredAny>,
    #[serde(default)]
    histograms: Option<IgnoredAny>,
}

/// What a backend's answer to `POST /api/v1/query` says: the samples of a vector, a scalar (one sample
/// without labels) or a matrix (every value of every series), or why there are none to judge.
pub fn parse_answer(status: u16, body: &[u8]) -> Answer {
    let success = (200..300).contains(&status);
    let envelope = match serde_json::from_slice::<Envelope>(body) {
        Ok(envelope) => envelope,
        // A proxy's error page, or anything else: its status says enough, its body is not echoed.
        Err(_) if !success => return Err(format!("HTTP {status}")),
        Err(e) => return Err(unreadable("the answer is not Prometheus API JSON", &e)),
    };
    if envelope.status == "error" || !success {
        return Err(api_error(status, &envelope));
    }
    if envelope.status != "success" {
        return Err("the answer's status is neither success nor error".into());
    }
    let data = match serde_json::from_slice::<Success>(body) {
        Ok(s) => s.data,
        Err(e) if e.to_string().starts_with(TOO_MANY) => return Err(too_many()),
        Err(e) => return Err(unreadable("the answer is not a Prometheus query result", &e)),
    };
    samples(data)
}

fn samples(data: Data) -> Answer {
    let shape = "the answer's result does not match its resultType";
    match (data.result_type.as_str(), data.result) {
        ("scalar", Some(Found::Point(value))) => {
            Ok(vec![Sample { labels: BTreeMap::new(), value: number(&value)? }])
        }
        ("vector", Some(Found::Series(series))) => {
            if series.len() > MAX_SAMPLES {
                return Err(too_many());
            }
            series.into_iter().map(instant).collect()
        }
        ("matrix", Some(Found::Series(series))) => range(series),
        ("vector" | "matrix", Some(Found::Point(_))) | ("scalar", Some(Found::Series(_))) => {
            Err(shape.into())
        }
        ("vector" | "matrix" | "scalar", None) => Err("the answer has no result".into()),
        ("string", _) => Err("the query answered a string, not a number: a metric must be a number".into()),
        _ => Err("the answer has an unknown resultType (expected vector, matrix or scalar)".into()),
    }
}

/// An instant vector's sample.
fn instant(series: Series) -> Result<Sample, String> {
    if series.histogram.is_some() {
        return Err(HISTOGRAM.into());
    }
    let (_, value) = series.value.ok_or("a series of the vector has no value")?;
    Ok(Sample { value: number(&value)?, labels: series.metric })
}

/// A range vector, judged on every value of every series: each series stands for its values by its
/// smallest and largest (every value is inside a range exactly when those two are; NaN values are no
/// data, a series of NaN alone one NaN sample). Its labels are copied at most twice, never once per value,
/// so a hostile answer cannot multiply its size in memory.
fn range(series: Vec<Series>) -> Answer {
    let total = series.iter().map(|s| s.values.as_ref().map_or(0, Vec::len)).fold(0, usize::saturating_add);
    if total > MAX_SAMPLES {
        return Err(too_many());
    }
    let mut samples = Vec::with_capacity(series.len().saturating_mul(2));
    for s in series {
        if s.histograms.is_some() {
            return Err(HISTOGRAM.into());
        }
        let values = s.values.unwrap_or_default();
        let mut numbers = Vec::with_capacity(values.len());
        for (_, value) in &values {
            numbers.push(number(value)?);
        }
        let known = numbers.iter().copied().filter(|v| !v.is_nan());
        let (min, max) = known.fold((None, None), |(lo, hi): (Option<f64>, Option<f64>), v| {
            (Some(lo.map_or(v, |l| l.min(v))), Some(hi.map_or(v, |h| h.max(v))))
        });
        match (min, max) {
            (Some(lo), Some(hi)) if lo == hi => samples.push(Sample { labels: s.metric, value: lo }),
            (Some(lo), Some(hi)) => {
                samples.push(Sample { labels: s.metric.clone(), value: lo });
                samples.push(Sample { labels: s.metric, value: hi });
            }
            _ if !numbers.is_empty() => samples.push(Sample { labels: s.metric, value: f64::NAN }),
            _ => {}
        }
    }
    Ok(samples)
}

const HISTOGRAM: &str = "the query answered native histograms, which have no single value: reduce them to a number (e.g. \
     histogram_quantile or histogram_count)";

/// Marks the streaming reader's refusal of an answer of too many series.
const TOO_MANY: &str = "too many series";

fn too_many() -> String {
    format!("the query answered more than {MAX_SAMPLES} samples: aggregate it (e.g. max, sum by)")
}

/// A sample's value: Prometheus writes numbers as strings, NaN and infinities as `NaN`, `+Inf`, `-Inf`.
fn number(value: &Value) -> Result<f64, String> {
    match value {
        Value::Number(n) => Ok(*n),
        Value::Text(text) => text.parse::<f64>().map_err(|_| "a sample's value is not a number".to_string()),
    }
}

/// The backend's own reason, its fields cleaned of control characters and cut short.
fn api_error(status: u16, envelope: &Envelope) -> String {
    let clean = |s: &str| s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect::<String>();
    let mut reason = format!("HTTP {status}");
    if let Some(kind) = envelope.error_type.as_deref().filter(|k| !k.is_empty()) {
        reason.push(' ');
        reason.push_str(&clean(kind));
    }
    if let Some(error) = envelope.error.as_deref().filter(|e| !e.is_empty()) {
        reason.push_str(": ");
        reason.push_str(&clean(error));
    }
    crate::core::text::cut(&reason, REASON_MAX)
}

/// Where a body stopped making sense, not what it said (serde's messages quote the input).
fn unreadable(what: &str, e: &serde_json::Error) -> String {
    let kind = match e.classify() {
        serde_json::error::Category::Data => "unexpected content",
        serde_json::error::Category::Eof => "it ends early",
        serde_json::error::Category::Syntax | serde_json::error::Category::Io => "not JSON",
    };
    format!("{what} ({kind} at line {}, column {})", e.line(), e.column())
}

impl<'de> Deserialize<'de> for Found {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_seq(FoundVisitor)
    }
}

struct FoundVisitor;

impl<'de> Visitor<'de> for FoundVisitor {
    type Value = Found;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of series, or [time, value]")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Found, A::Error> {
        match seq.next_element::<First>()? {
            None => Ok(Found::Series(Vec::new())),
            Some(First::Series(first)) => {
                let mut series = vec![first];
                while let Some(next) = seq.next_element::<Series>()? {
                    // Refused as it streams: a body of tiny series would otherwise all be held first.
                    if series.len() >= MAX_SAMPLES {
                        return Err(de::Error::custom(TOO_MANY));
                    }
                    series.push(next);
                }
                Ok(Found::Series(series))
            }
            Some(First::Time) => {
                let value =
                    seq.next_element::<Value>()?.ok_or_else(|| de::Error::invalid_length(1, &self))?;
                match seq.next_element::<IgnoredAny>()? {
                    Some(_) => Err(de::Error::invalid_length(3, &self)),
                    None => Ok(Found::Point(value)),
                }
            }
        }
    }
}

/// A result's first element: a series (an object) or a point's time (a number).
enum First {
    Series(Series),
    Time,
}

impl<'de> Deserialize<'de> for First {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(FirstVisitor)
    }
}

struct FirstVisitor;

impl<'de> Visitor<'de> for FirstVisitor {
    type Value = First;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a series or a time")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<First, A::Error> {
        Series::deserialize(MapAccessDeserializer::new(map)).map(First::Series)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<First, E> {
        Ok(First::Time)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<First, E> {
        Ok(First::Time)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<First, E> {
        Ok(First::Time)
    }
}

#[cfg(test)]
#[path = "answer_tests.rs"]
mod tests;
