// Package a2amqtt carries A2A v1.0 over MQTT v5, following the A2A over MQTT profile v0.1.
//
// Every protocol type, error and JSON encoding is a2a-go's (github.com/a2aproject/a2a-go/v2):
//   - Connect opens one MQTT v5 connection per agent identity (client id {org}/{unit}/{agent});
//     it reconnects and resubscribes for ever, and with Config.Card it publishes the agent's
//     presence (a retained card, an offline card as its will).
//   - NewRequester and Requester.Transport give an a2aclient.Transport that sends requests to
//     $a2a/v1/request/{org}/{unit}/{agent} with a Response Topic and Correlation Data and
//     collects the replies, with the profile's retries and timeouts; NewClient does it all in
//     one call.
//   - NewResponder serves an a2asrv.AgentExecutor on the agent's request topic: binding
//     validation, de-duplication, the requester-created task ids of the profile, graceful
//     Shutdown.
//   - Conversation, InputRequired, InterruptionOf and friends are the multi-turn helpers;
//     Directory and ResolveCard discover agents from their retained cards; BrokerTLS and
//     TLSFiles build broker TLS settings that follow certificate rotations.
//
// JSON-RPC errors come back as *RPCError (pkg/rpcerr's Error), which errors.Is maps to a2a-go's
// sentinels or to the profile's (ErrRequestExpired, ErrResponderUnavailable, ...).
//
// docs/sdk.md is the guide, docs/protocol.md the wire decisions.
package a2amqtt
