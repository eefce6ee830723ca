// Package ownership splits the gated agents between the conversation service's replicas that
// share a Redis journal (docs/conversation-service.md, "Replicas"). Each replica heartbeats
// into the live set; every agent is assigned by rendezvous hashing over the live replicas (each
// replica computes the same assignment, and a replica joining or leaving moves only its share).
// An assigned replica takes the agent's lease (fencing token), rebuilds the agent's state from
// the journal and only then serves it; from then on it decides from memory with no round trip
// but the fenced group commit. A replica that loses an agent's assignment stops consuming its
// requests, then gives the lease up; one whose lease was taken (it was paused past the TTL) is
// fenced off by the commit script and drops the agent. Replies reaching a replica that no
// longer owns their agent are relayed as always and their events handed to the owner (inbox).
//
// This is also the partition of request topics between replicas on brokers without shared
// subscriptions on $-topics (Mosquitto 2.0.x): each request is delivered to its agent's owner
// only, with no per-request claim.
//
// Hand-overs lose no request and answer none twice: an assigned replica consumes the agent's
// request topic before it holds the agent and holds back (parks) what it receives until it
// does; the previous owner decides until it lets the agent go, then records the requests it
// handled last (convstore.Memory.Drop), which the new owner drops as duplicates. A replica
// restarted under the same id takes its leases back from its crashed previous run at once
// (Leases.TakeOver).
//
// A Replica reaches the shared store through Leases: *convstore.RedisJournal in production,
// MemoryLeases (one process, several replicas) in unit tests.
package ownership
