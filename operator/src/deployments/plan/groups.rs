//! A pass's DeviceGroups: each group's status (its members, or why it could not be resolved).

use super::*;

/// A resolved group's Ready message: its member count, and the listed ids that have no Device (yet).
fn group_message(members: usize, unknown: &[&str]) -> String {
    let mut m = devices(members as u32);
    if !unknown.is_empty() {
        let shown: Vec<&str> = unknown.iter().take(UNKNOWN_EXAMPLES).copied().collect();
        let more = unknown.len() - shown.len();
        m.push_str(&format!("; listed but no Device yet: {}", shown.join(", ")));
        if more > 0 {
            m.push_str(&format!(" and {more} more"));
        }
    }
    m
}

pub(super) fn groups(s: &Snapshot, fleet: &Fleet, plan: &mut Plan) {
    for g in &s.groups {
        let (count, want) = match fleet.groups.get(&g.name_any()) {
            Some(Ok(m)) => (
                Some(m.len() as u32),
                ready_want(&Ok(group_message(
                    m.len(),
                    &placement::unknown_listed(&g.spec, &fleet.labels),
                ))),
            ),
            Some(Err(e)) => (None, ready_want(&Err((e.reason(), e.to_string())))),
            None => continue,
        };
        plan.groups.push(StatusPlan {
            obj: g.clone(),
            old: g.status.clone().unwrap_or_default(),
            next: DeviceGroupStatus {
                member_count: count,
                conditions: vec![],
            },
            wants: vec![want],
            nats: false,
        });
    }
}
