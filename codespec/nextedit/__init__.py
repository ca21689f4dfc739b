"""Next-edit suggestions: the edits a user made, and the edit the model predicts after them."""
