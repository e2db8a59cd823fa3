package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PrometheusProvider is a Prometheus-compatible HTTP query API.
type PrometheusProvider struct {
	// address is the API's base URL (http or https), for example
	// http://prometheus.monitoring:9090: an analysis POSTs its query to
	// <address>/api/v1/query.
	// +required
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() in ['http', 'https'] && url(self).getHostname() != ''",message="must be an http or https URL with a host"
	Address string `json:"address"`
}

// WebhookProvider is an HTTP endpoint that judges a wave.
type WebhookProvider struct {
	// url receives a POST with a JSON document naming the set, its
	// namespace, the revision, the wave and its nodes; its answer (status
	// and JSON body) is what the metric's successCondition reads.
	// +required
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() in ['http', 'https'] && url(self).getHostname() != ''",message="must be an http or https URL with a host"
	URL string `json:"url"`
}

// AnalysisProviderSpec is one endpoint and its bounds. Exactly one of
// prometheus and webhook is set.
// +kubebuilder:validation:XValidation:rule="has(self.prometheus) != has(self.webhook)",message="set exactly one of prometheus and webhook"
type AnalysisProviderSpec struct {
	// prometheus is a Prometheus-compatible query API.
	// +optional
	Prometheus *PrometheusProvider `json:"prometheus,omitempty"`

	// webhook is an HTTP endpoint.
	// +optional
	Webhook *WebhookProvider `json:"webhook,omitempty"`

	// timeoutSeconds bounds each request, connection included: a provider
	// that does not answer in time gives the measurement an error.
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=60
	TimeoutSeconds *int32 `json:"timeoutSeconds,omitempty"`

	// maxResponseBytes bounds the body of each answer: a longer one gives
	// the measurement an error and is not read further.
	// +optional
	// +kubebuilder:default=262144
	// +kubebuilder:validation:Minimum=1024
	// +kubebuilder:validation:Maximum=16777216
	MaxResponseBytes *int32 `json:"maxResponseBytes,omitempty"`

	// allowedNamespaces are the namespaces whose ActivationSets may use
	// this provider; empty: every namespace.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	AllowedNamespaces []string `json:"allowedNamespaces,omitempty"`
}

// AnalysisProvider is an endpoint the fleet controller may query for an
// ActivationSet's analysis: a Prometheus-compatible API or a webhook. It is
// cluster-scoped and written by cluster administrators; sets reference it
// by name, so a namespace cannot point the fleet controller at an
// arbitrary URL and read the answer back from its status.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=aprov,categories=iteron
// +kubebuilder:printcolumn:name="Prometheus",type=string,JSONPath=`.spec.prometheus.address`
// +kubebuilder:printcolumn:name="Webhook",type=string,JSONPath=`.spec.webhook.url`
// +kubebuilder:printcolumn:name="Timeout",type=integer,JSONPath=`.spec.timeoutSeconds`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type AnalysisProvider struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitzero"`

	// spec is the endpoint and its bounds.
	// +required
	Spec AnalysisProviderSpec `json:"spec"`
}

// AnalysisProviderList is a list of AnalysisProvider.
//
// +kubebuilder:object:root=true
type AnalysisProviderList struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitzero"`
	// items are the providers.
	Items []AnalysisProvider `json:"items"`
}

func init() {
	SchemeBuilder.Register(&AnalysisProvider{}, &AnalysisProviderList{})
}
