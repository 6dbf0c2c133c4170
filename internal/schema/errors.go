package schema

import "errors"

var (
	// ErrInvalidSchema is returned by ValidateDefinition, Compile and
	// CompileDescriptorSet for a definition the Pub/Sub service would refuse:
	// one that does not parse, a Protocol Buffer definition with imports or
	// more than one top-level type, one over MaxDefinitionSize, an
	// unspecified type.
	ErrInvalidSchema = errors.New("invalid schema")

	// ErrInvalidMessage is returned by (*Schema).Validate for data that is
	// not a valid message of the schema in the given encoding, and for an
	// unspecified encoding.
	ErrInvalidMessage = errors.New("invalid message")

	// ErrIncompatible is returned by Compatible for a new revision that
	// breaks the service's revision rules: a Protocol Buffer revision may
	// only add or remove optional fields; an Avro revision must be readable
	// by, and able to read, the previous one.
	ErrIncompatible = errors.New("incompatible schema revision")
)
