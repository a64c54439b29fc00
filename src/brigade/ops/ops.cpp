// filled in by the ops work
