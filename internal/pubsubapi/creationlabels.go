package pubsubapi

// TopicCreationLabels and SubscriptionCreationLabels are the jetorder
// labels that a topic or a subscription reads only when it is created
// (docs/SIDECAR.md): a later value changes nothing, so UpdateTopic and
// UpdateSubscription refuse to change some of them, and a resources file
// (internal/resources) may not declare another value for any. Each maps
// to the value an existing resource without the label has, or "" when
// that depends on how it was created.
func TopicCreationLabels() map[string]string {
	return map[string]string{labelKeyStreams: "1"} // keyStreams records counts over 1
}

// SubscriptionCreationLabels: see TopicCreationLabels.
func SubscriptionCreationLabels() map[string]string {
	return map[string]string{labelDelivery: "", labelPartitions: "", labelPartitionBuffer: ""}
}
