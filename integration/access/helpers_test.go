package access

import "cloud.google.com/go/pubsub/v2"

func pubsubMessage(data string) *pubsub.Message { return &pubsub.Message{Data: []byte(data)} }
