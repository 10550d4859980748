//! DescribeConfigs (versions 1–4) for topics: a topic's settings under
//! Kafka's names (`TopicConfig::entries`), each marked as the broker's
//! default (`DEFAULT_CONFIG`) or set on the topic (`DYNAMIC_TOPIC_CONFIG`).
//! Other resource types get `INVALID_REQUEST` per resource, an unknown
//! topic `UNKNOWN_TOPIC_OR_PARTITION`; no resource fails the whole answer.

use super::api::{encoded, s, Answer};
use super::error_code;
use crate::shard::ShardContext;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse};
use shardlog_schema::wire::ErrorCode;
use std::rc::Rc;

/// Kafka's `ConfigResource.Type.TOPIC`.
const RESOURCE_TOPIC: i8 = 2;
/// Kafka's `ConfigSource`: set on the topic, or the broker's default.
const SOURCE_TOPIC: i8 = 1;
const SOURCE_DEFAULT: i8 = 5;
/// Kafka's `INVALID_REQUEST`.
const INVALID_REQUEST: i16 = 42;

pub(super) fn describe_configs(ctx: &Rc<ShardContext>, req: DescribeConfigsRequest, version: i16) -> Answer {
    let topics = ctx.topics.borrow();
    let defaults = ctx.config.topic_defaults.entries();
    let mut r = DescribeConfigsResponse::default();
    for resource in req.resources {
        let mut out = DescribeConfigsResult::default();
        out.resource_type = resource.resource_type;
        out.resource_name = resource.resource_name.clone();
        if resource.resource_type != RESOURCE_TOPIC {
            out.error_code = INVALID_REQUEST;
            out.error_message = Some(s("only topic configs can be described"));
            r.results.push(out);
            continue;
        }
        let Some(meta) = topics.get(resource.resource_name.as_str()) else {
            out.error_code = error_code(ErrorCode::UnknownTopicOrPartition);
            out.error_message = Some(s("unknown topic"));
            r.results.push(out);
            continue;
        };
        let wanted = |name: &str| {
            resource.configuration_keys.as_ref().is_none_or(|keys| keys.iter().any(|k| k.as_str() == name))
        };
        for (name, value) in meta.config.entries() {
            if !wanted(&name) {
                continue;
            }
            let mut c = DescribeConfigsResourceResult::default();
            let is_default = defaults.iter().any(|(n, v)| *n == name && *v == value);
            c.config_source = if is_default { SOURCE_DEFAULT } else { SOURCE_TOPIC };
            c.name = s(&name);
            c.value = Some(s(&value));
            out.configs.push(c);
        }
        r.results.push(out);
    }
    encoded(&r, version)
}
