// Package conformance holds the cross-backend test suite: one table of
// broker-side identity scenarios run against a real Mosquitto 2.0.x with the
// dynamic-security plugin (package dynsec) and against the embedded mochi
// broker (package embedded), with real MQTT v5 clients checking SUBACK,
// PUBACK and CONNACK codes and actual deliveries. It has no non-test code.
package conformance
