//! The agent's two relays between NATS and the updater, each a state machine without I/O whose transitions
//! return the effects the agent loop carries out: the agent upgrade (`agent-upgrade-intent/<device>` →
//! `agent-upgrade-status/<device>`) and the system upgrade of a task run (`system-upgrade-intent/<device>.<run>`
//! → `system-upgrade-status/<device>.<run>`).

pub mod agent_upgrade;
pub mod system_upgrade;
