// Package registration_test runs the operator's broker side against a real
// control plane (envtest: KUBEBUILDER_ASSETS) and real brokers: the ACL
// matrix on Mosquitto + dynsec, on Mosquitto + the decision-table plugin and on the embedded broker, the broker
// runtime's self-healing, orphan collection, and the fleet registration
// benchmark. internal/registration's own tests are pure and need neither.
package registration_test
