package artifacts

import (
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// toOCI converts a descriptor for oras-go.
func toOCI(d Descriptor) ocispec.Descriptor {
	out := ocispec.Descriptor{
		MediaType: d.MediaType, Digest: digest.Digest(d.Digest), Size: d.Size,
		Annotations: d.Annotations, ArtifactType: d.ArtifactType,
	}
	if d.Platform != nil {
		out.Platform = &ocispec.Platform{Architecture: d.Platform.Architecture, OS: d.Platform.OS, Variant: d.Platform.Variant}
	}
	return out
}

// fromOCI converts an oras-go descriptor.
func fromOCI(d ocispec.Descriptor) Descriptor {
	return Descriptor{MediaType: d.MediaType, Digest: d.Digest.String(), Size: d.Size, Annotations: d.Annotations, ArtifactType: d.ArtifactType}
}
