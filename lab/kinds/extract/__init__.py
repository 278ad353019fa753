"""The ``extract`` kind: a teacher's top-k over a dataset's sequences, and the top-k store it writes."""
