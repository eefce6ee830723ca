// Package hardening checks the install's hardening switches on their renders (kustomize build of
// config/quickstart with its components, helm template of the chart with the values): TLS for
// every party (config/quickstart/tls-everywhere, tls.everywhere) and the NetworkPolicy set
// (config/networkpolicy, networkPolicy.enabled), which party each policy admits to which port.
// The kind cluster's CNI (a bridge conflist, hack/kind) enforces no NetworkPolicy, so the
// policies are evaluated here against the pods' labels, as the NetworkPolicy API defines it.
package hardening
