// Package gateway joins A2A agents that speak HTTP to the MQTT fleet, both ways, under the
// fleet's identities (docs/gateway.md):
//
//   - inbound (HTTP → bus): an Agent with spec.http.expose is served as a standard A2A v1.0
//     JSON-RPC endpoint (a2a-go's a2asrv handler, SSE for streams, the card at the well-known
//     path). Every caller presents a Kubernetes ServiceAccount token, checked with TokenReview and
//     mapped to the Agent whose spec.http.serviceAccounts lists it; the request enters the bus
//     over that Agent's own MQTT connection (its credentials, pooled per identity), so the
//     broker's ACLs and the conversation service's policies judge it as they judge any MQTT
//     caller.
//   - outbound (bus → HTTP): an Agent with spec.http.url is held on the bus by the gateway: it
//     connects with that Agent's credentials, serves its request (or delivery) topic with the
//     SDK's Responder and forwards each request to the HTTP agent with a2a-go's JSON-RPC client.
//
// The gateway keeps no state of its own beyond connections: the cards, the identity mapping and
// the credentials are read from the API server, and a task's state lives with the agent that
// runs it, so a caller that lost a stream re-reads the task with GetTask through any replica.
package gateway
