// Package hardening checks the install's hardening switches on their renders (kustomize build of
// config/quickstart with its components, helm template of the chart with the values): TLS for
// every party (config/quickstart/tls-everywhere, tls.everywhere) and the NetworkPolicy set
// (config/networkpolicy, networkPolicy.enabled), which party each policy admits to which port
// and where each pod of the install may connect under a namespace-wide default deny.
// The kind cluster's CNI (a bridge conflist, hack/kind) enforces no NetworkPolicy, so the
// policies are evaluated here against the pods' labels, as the NetworkPolicy API defines it.
// The optional decision service (config/quickstart/decision-service, decisionService.enabled)
// is checked the same way: both renders agree, and its replicas, disruption budget, Service,
// read-only RBAC and security context are as the install promises.
package hardening
