"""Model loading: the manifest (`reactor.yaml`) and the spec read from a model class."""
